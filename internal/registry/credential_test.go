package registry

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
)

// TestCredential: a fresh credential is 256 bits of base64url, its hash
// is its SHA-256, it matches only itself, and nothing prints it.
func TestCredential(t *testing.T) {
	secret, hash, err := newCredential()
	if err != nil {
		t.Fatal(err)
	}
	if raw, err := base64.RawURLEncoding.DecodeString(secret); err != nil || len(raw) != 32 {
		t.Fatalf("credential %q: %d bytes, %v", secret, len(raw), err)
	}
	if want := sha256.Sum256([]byte(secret)); string(hash) != string(want[:]) {
		t.Fatal("the stored hash is not the credential's SHA-256")
	}
	other, _, err := newCredential()
	if err != nil || other == secret {
		t.Fatalf("a second credential: %v (same: %v)", err, other == secret)
	}
	h := credentialHashOf(hash)
	for _, tt := range []struct {
		name string
		h    CredentialHash
		c    Credential
		want CredentialCheck
	}{
		{"own", h, PresentedCredential(secret), CredentialMatches},
		{"another's", h, PresentedCredential(other), CredentialWrong},
		{"none", h, PresentedCredential(""), CredentialMissing},
		{"instance without one", CredentialHash{}, PresentedCredential(secret), CredentialNotNeeded},
		{"neither", CredentialHash{}, Credential{}, CredentialNotNeeded},
		{"a stored hash of the wrong length", credentialHashOf(hash[:16]), PresentedCredential(secret), CredentialNotNeeded},
	} {
		if got := tt.h.Check(tt.c); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
	if got := fmt.Sprintf("%v %+v %s", PresentedCredential(secret), PresentedCredential(secret), PresentedCredential(secret)); strings.Contains(got, secret) {
		t.Errorf("a presented credential prints its secret: %s", got)
	}
}
