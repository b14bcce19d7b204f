package lease

import "regexp"

// tokenPattern is the form of a holder token: what the store issues (32 hex digits) fits,
// and nothing that could be a path, a query or an oversized key does.
var tokenPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// ValidToken reports whether token has the form of a holder token.
func ValidToken(token string) bool { return tokenPattern.MatchString(token) }
