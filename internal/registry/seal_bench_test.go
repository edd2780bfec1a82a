package registry

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/seal"
)

// BenchmarkVerifySeals is the evaluator's cost per row it checks: an
// identity for each instance it does not know yet (every live one at a
// rebuild), an end for each ended row (every ended one at a rebuild).
func BenchmarkVerifySeals(b *testing.B) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	s := audit.NewKeySigner(priv)
	r := &Registry{trust: seal.NewTrust(seal.Keys{}.With(s))}
	now := time.Now().UTC().Truncate(time.Microsecond)
	in := Instance{ID: uuid.Must(uuid.NewV7()), Service: "web", Address: "10.0.0.1", Port: 8080, Zone: "az1", Region: "local",
		Source: SourceRegistered, RegisteredBy: "workload:web", CreatedAt: now, State: StateDeregistered, EndedAt: &now}
	sig, kid, _ := seal.Sign(context.Background(), s, identityDomain, identityOf(in.ID.String(), in.Service, in.Address, int32(in.Port), in.Zone, in.Region, in.Source, in.RegisteredBy, now.UnixMicro()))
	esig, _, _ := seal.Sign(context.Background(), s, endDomain, endOf(in.ID.String(), in.State, now.UnixMicro()))
	in.seals = seals{seal: string(sig), sealKey: &kid, endSeal: string(esig), endSealKey: &kid}
	b.Run("identity", func(b *testing.B) {
		for b.Loop() {
			if err := r.VerifyIdentity(in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("end", func(b *testing.B) {
		for b.Loop() {
			if err := r.VerifyEnd(in); err != nil {
				b.Fatal(err)
			}
		}
	})
}
