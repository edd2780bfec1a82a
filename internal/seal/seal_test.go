package seal_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"testing"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/seal"
)

type row struct {
	ID     string  `json:"id"`
	Weight float64 `json:"weight"`
}

func TestSeal(t *testing.T) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s := audit.NewKeySigner(priv)
	keys := seal.Keys{}.With(s)
	r := row{ID: "a", Weight: 0.25}
	sig, kid, err := seal.Sign(context.Background(), s, "muster test seal v1", r)
	if err != nil || kid != s.KeyID() {
		t.Fatalf("sign: %v %q", err, kid)
	}
	other := "k"
	for _, tc := range []struct {
		name   string
		domain string
		v      row
		sig    []byte
		kid    *string
		keys   seal.Keys
		want   error
	}{
		{"as sealed", "muster test seal v1", r, sig, &kid, keys, nil},
		{"another domain", "muster other seal v1", r, sig, &kid, keys, seal.ErrBadSeal},
		{"another weight", "muster test seal v1", row{ID: "a", Weight: 0}, sig, &kid, keys, seal.ErrBadSeal},
		{"no signature", "muster test seal v1", r, nil, &kid, keys, seal.ErrUnsealed},
		{"no key id", "muster test seal v1", r, sig, nil, keys, seal.ErrUnsealed},
		{"a key not trusted", "muster test seal v1", r, sig, &other, keys, seal.ErrUnknownKey},
		{"no keys: trusted as is", "muster test seal v1", row{}, nil, nil, seal.Keys{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.keys.Verify(tc.domain, tc.v, tc.sig, tc.kid); !errors.Is(err, tc.want) {
				t.Fatalf("verify: %v, want %v", err, tc.want)
			}
		})
	}
	// With copies: the original keys are not changed.
	base := seal.Keys{}
	if got := base.With(s); len(got) != 1 || len(base) != 0 {
		t.Fatalf("With: %d keys, base %d", len(got), len(base))
	}
	if got := seal.Keys(nil).With(nil); got == nil || len(got) != 0 {
		t.Fatalf("nil With nil: %v", got)
	}
}

// TestMemo: a memo passes what verified and refuses what does not, a row
// changed after it was remembered included, across passes.
func TestMemo(t *testing.T) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s := audit.NewKeySigner(priv)
	keys := seal.Keys{}.With(s)
	const domain = "muster test seal v1"
	r := row{ID: "a", Weight: 0.25}
	sig, kid, err := seal.Sign(context.Background(), s, domain, r)
	if err != nil {
		t.Fatal(err)
	}
	var m seal.Memo
	for pass := range 3 {
		m.Next()
		if err := m.Verify(keys, domain, r, sig, &kid); err != nil {
			t.Fatalf("pass %d, the sealed row: %v", pass, err)
		}
		if err := m.Verify(keys, domain, row{ID: "a", Weight: 0}, sig, &kid); !errors.Is(err, seal.ErrBadSeal) {
			t.Fatalf("pass %d, the row changed after it was remembered: %v", pass, err)
		}
		if err := m.Verify(keys, domain, r, nil, &kid); !errors.Is(err, seal.ErrUnsealed) {
			t.Fatalf("pass %d, no seal: %v", pass, err)
		}
	}
	if err := m.Verify(seal.Keys{}, domain, row{}, nil, nil); err != nil {
		t.Fatalf("without keys: %v", err)
	}
}

// BenchmarkMemo is the cost of a refresh's check of an unchanged row,
// against a verification.
func BenchmarkMemo(b *testing.B) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	s := audit.NewKeySigner(priv)
	keys := seal.Keys{}.With(s)
	const domain = "muster test seal v1"
	r := row{ID: "a", Weight: 0.25}
	sig, kid, _ := seal.Sign(context.Background(), s, domain, r)
	b.Run("verify", func(b *testing.B) {
		for b.Loop() {
			_ = keys.Verify(domain, r, sig, &kid)
		}
	})
	b.Run("memo", func(b *testing.B) {
		var m seal.Memo
		for b.Loop() {
			m.Next()
			_ = m.Verify(keys, domain, r, sig, &kid)
		}
	})
}
