package policy

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/seal"
)

type memSigner struct{ key ed25519.PrivateKey }

func (m memSigner) KeyID() string             { return "k1" }
func (m memSigner) Public() ed25519.PublicKey { return m.key.Public().(ed25519.PublicKey) }
func (m memSigner) Sign(_ context.Context, msg []byte) ([]byte, error) {
	return ed25519.Sign(m.key, msg), nil
}

// TestSealCoversWhatAnOverrideDoes: a change to any field that decides
// which instance an override moves, which way, for how long or in whose
// name breaks its seal; the fields it does not cover (state, the
// co-signer's justification) do not.
func TestSealCoversWhatAnOverrideDoes(t *testing.T) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s := memSigner{priv}
	keys := SealKeys{}.With(s)
	at := time.Date(2026, 12, 2, 1, 0, 0, 123000, time.UTC)
	cosigner, why := "operator:alice", "confirmed on the bridge"
	base := db.Override{
		ID: uuid.Must(uuid.NewV7()), InstanceID: uuid.Must(uuid.NewV7()), Service: "web", Zone: "az1",
		Action: "mark_ineligible", State: "active", Actor: "operator:oscar", Justification: "corrupting orders, INC-77",
		Cosigner: &cosigner, CosignJustification: &why, CreatedAt: at, ExpiresAt: at.Add(time.Hour),
	}
	sig, kid, err := seal.Sign(context.Background(), s, sealDomain, sealedOf(base))
	if err != nil {
		t.Fatal(err)
	}
	base.Seal, base.SealKey = sig, &kid
	if err := verifyRow(keys, base); err != nil {
		t.Fatalf("the sealed row: %v", err)
	}
	other := "operator:mallory"
	for _, tc := range []struct {
		name   string
		change func(*db.Override)
		want   error
	}{
		{"instance", func(o *db.Override) { o.InstanceID = uuid.Must(uuid.NewV7()) }, ErrBadSeal},
		{"service", func(o *db.Override) { o.Service = "api" }, ErrBadSeal},
		{"zone", func(o *db.Override) { o.Zone = "az2" }, ErrBadSeal},
		{"action", func(o *db.Override) { o.Action = "mark_eligible" }, ErrBadSeal},
		{"actor", func(o *db.Override) { o.Actor = other }, ErrBadSeal},
		{"justification", func(o *db.Override) { o.Justification += "." }, ErrBadSeal},
		{"co-signer", func(o *db.Override) { o.Cosigner = &other }, ErrBadSeal},
		{"no co-signer", func(o *db.Override) { o.Cosigner = nil }, ErrBadSeal},
		{"created", func(o *db.Override) { o.CreatedAt = o.CreatedAt.Add(-time.Microsecond) }, ErrBadSeal},
		{"expiry", func(o *db.Override) { o.ExpiresAt = o.ExpiresAt.Add(time.Microsecond) }, ErrBadSeal},
		{"another row's seal", func(o *db.Override) { o.ID = uuid.Must(uuid.NewV7()) }, ErrBadSeal},
		{"no seal", func(o *db.Override) { o.Seal = nil }, ErrUnsealed},
		{"no key", func(o *db.Override) { o.SealKey = nil }, ErrUnsealed},
		{"an unknown key", func(o *db.Override) { k := "k2"; o.SealKey = &k }, ErrUnknownKey},
		{"state (not covered)", func(o *db.Override) { o.State = "lifted" }, nil},
		{"co-sign justification (not covered)", func(o *db.Override) { o.CosignJustification = nil }, nil},
		{"the same instant in another zone", func(o *db.Override) { o.ExpiresAt = o.ExpiresAt.In(time.FixedZone("x", 3600)) }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.change(&o)
			if err := verifyRow(keys, o); !errors.Is(err, tc.want) {
				t.Fatalf("verify: %v, want %v", err, tc.want)
			}
		})
	}
	// No keys configured: muster trusts the table as it is.
	if err := verifyRow(SealKeys{}, db.Override{}); err != nil {
		t.Fatalf("without keys: %v", err)
	}
}
