//go:build !unix

package mongotest

// lockFile is a no-op where flock is not available: concurrent builds then race, which is
// harmless as each writes its own temporary file and renames it into place.
func lockFile(string) (func(), error) { return func() {}, nil }
