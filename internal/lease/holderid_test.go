package lease

import (
	"strings"
	"testing"
)

// TestHolderIDHidesTheToken: the public ID is a fixed function of the token (every process
// derives the same), has the form of an object name and no token's, and shares no run of
// the token's digits, so that no part of the token can be read off it.
func TestHolderIDHidesTheToken(t *testing.T) {
	for _, token := range []string{
		"0123456789abcdef0123456789abcdef",
		"ffffffffffffffffffffffffffffffff",
		"91eede00000000000000000000000000",
	} {
		id := HolderID(token)
		if id != HolderID(token) {
			t.Errorf("HolderID(%s) is not stable", token)
		}
		if !ValidHolderID(id) {
			t.Errorf("HolderID(%s) = %q, not of the ID form", token, id)
		}
		if strings.HasPrefix(id, HolderIDPrefix) && ValidHolderID(token) {
			t.Errorf("token %s has the ID form", token)
		}
		hash := strings.TrimPrefix(id, HolderIDPrefix)
		for i := 0; i+6 <= len(token); i++ {
			if strings.Contains(hash, token[i:i+6]) {
				t.Errorf("HolderID(%s) = %s contains the token's digits %q", token, id, token[i:i+6])
			}
		}
	}
	if HolderID("0123456789abcdef0123456789abcdef") == HolderID("0123456789abcdef0123456789abcdee") {
		t.Error("two tokens one digit apart share an ID")
	}
}
