package seal_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/seal"
)

func newSigner(t *testing.T) seal.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return audit.NewKeySigner(priv)
}

// TestReseal: a rotation re-seals, under the new key, only the rows whose
// seal verifies under the keys trusted now, and leaves a forged or
// untrusted row as it is.
func TestReseal(t *testing.T) {
	ctx := context.Background()
	const domain = "muster test seal v1"
	oldKey, newKey, stranger := newSigner(t), newSigner(t), newSigner(t)
	trusted := seal.Keys{}.With(oldKey).With(newKey)

	stored := map[string][]byte{}
	mk := func(name string, v row, by seal.Signer, tamper bool) seal.Row {
		sig, kid, err := seal.Sign(ctx, by, domain, v)
		if err != nil {
			t.Fatal(err)
		}
		if tamper {
			v.Weight = 0 // the row changed after muster sealed it
		}
		return seal.Row{Name: name, Value: v, Sig: sig, KeyID: &kid, Store: func(sig []byte, kid string) (bool, error) {
			if kid != newKey.KeyID() {
				t.Errorf("%s re-sealed by key %s, want the new key %s", name, kid, newKey.KeyID())
			}
			if err := trusted.Verify(domain, v, sig, &kid); err != nil {
				t.Errorf("the new seal of %s does not verify: %v", name, err)
			}
			stored[name] = sig
			return true, nil
		}}
	}
	rows := []seal.Row{
		mk("good", row{ID: "a", Weight: 1}, oldKey, false),
		mk("forged", row{ID: "b", Weight: 1}, oldKey, true),
		mk("stranger", row{ID: "c", Weight: 1}, stranger, false),
	}
	b, err := seal.Reseal(ctx, newKey, trusted, domain, rows)
	if err != nil {
		t.Fatal(err)
	}
	if b.Resealed != 1 || len(b.Refused) != 2 || stored["good"] == nil || stored["forged"] != nil || stored["stranger"] != nil {
		t.Fatalf("resealed %d, refused %q, stored %v: want only the good row re-sealed", b.Resealed, b.Refused, stored)
	}
	if !strings.Contains(b.Refused[0], "forged") || !strings.Contains(b.Refused[1], "stranger") {
		t.Errorf("refused rows named %q", b.Refused)
	}
	if _, err := seal.Reseal(ctx, newKey, nil, domain, rows); !errors.Is(err, seal.ErrNoTrust) {
		t.Errorf("a rotation trusting no key: %v, want ErrNoTrust", err)
	}
}
