package lease

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
)

// HolderIDPrefix starts every public holder ID, so that an ID is never mistaken for a token
// (a token is 32 hex digits without it; an ID is no valid token, the admission API refuses
// it) and is a valid Kubernetes object name.
const HolderIDPrefix = "lh-"

// holderIDDomain separates this hash from any other use of SHA-256 on a token.
const holderIDDomain = "lease.vancetope.io/holder-id\x00"

// holderIDHexLen is the length of the hash part: 96 bits.
const holderIDHexLen = 24

// HolderID returns the public ID of the holder with token: the name under which views,
// lists, logs, Events and metrics show it (docs/live-api.md, "Holder IDs"). It is a
// truncated SHA-256 of the token. A token carries 128 random bits, so the ID cannot be
// turned back into the token, neither by inverting the hash nor by trying tokens; no key is
// needed, so every replica, agent and `kubectl lease --force` derive the same ID, also for
// holders stored before IDs existed.
func HolderID(token string) string {
	sum := sha256.Sum256([]byte(holderIDDomain + token))
	return HolderIDPrefix + hex.EncodeToString(sum[:])[:holderIDHexLen]
}

var holderIDPattern = regexp.MustCompile(`^lh-[0-9a-f]{24}$`)

// ValidHolderID reports whether id has the form of a public holder ID.
func ValidHolderID(id string) bool { return holderIDPattern.MatchString(id) }
