package resolver_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/resolver"
)

// region is a signing assembler and the keys a client would be given.
type signingRegion struct {
	asm  *assembler.Assembler
	keys map[string]ed25519.PublicKey
	next uint64
	in   []assembler.InstanceInput
}

func newSigningRegion(t *testing.T) *signingRegion {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	kid := resolver.KeyID(pub)
	sign := assembler.SignWith("replica-1", kid, func(msg []byte) ([]byte, error) { return ed25519.Sign(priv, msg), nil }, nil)
	r := &signingRegion{asm: assembler.New(assembler.Options{Sign: sign}), keys: map[string]ed25519.PublicKey{kid: pub}}
	for i := range 6 {
		r.in = append(r.in, assembler.InstanceInput{ID: uuid.UUID{15: byte(i + 1)}, Address: fmt.Sprintf("10.0.0.%d", i+1), Port: 8080,
			Zone: []string{"a", "b"}[i%2], State: eligibility.Eligible, Weight: 1, HealthKnown: true})
	}
	return r
}

// publish assembles web with the current inputs and traffic and returns
// the published view and delta as a client decodes them.
func (r *signingRegion) publish(t *testing.T, at time.Time, traffic float64) (resolver.View, *resolver.Delta) {
	t.Helper()
	r.asm.Update(assembler.ServiceInput{Name: "web", MinHealthyFraction: 0.5, Capabilities: []string{"probe"}, Instances: r.in,
		Traffic: func(string) float64 { return traffic }}, at)
	var pubs []assembler.Published
	for i := 0; len(pubs) == 0 && i < 100; i++ {
		var err error
		if pubs, err = r.asm.Drain(at.Add(time.Duration(i)*time.Minute), r); err != nil {
			t.Fatal(err)
		}
	}
	if len(pubs) != 1 {
		t.Fatalf("%d publications", len(pubs))
	}
	var v resolver.View
	if err := json.Unmarshal(pubs[0].ViewJSON, &v); err != nil {
		t.Fatal(err)
	}
	if pubs[0].DeltaJSON == nil {
		return v, nil
	}
	var d resolver.Delta
	if err := json.Unmarshal(pubs[0].DeltaJSON, &d); err != nil {
		t.Fatal(err)
	}
	return v, &d
}

func (r *signingRegion) Next(n int) (uint64, error) {
	first := r.next + 1
	r.next += uint64(n)
	return first, nil
}

// What muster's assembler signs, the client verifies: a view, a delta
// that withdraws an instance, and one that changes only a zone's traffic
// weight all apply with the region's keys configured.
func TestSignedUpdatesFromMusterVerify(t *testing.T) {
	t.Parallel()
	r := newSigningRegion(t)
	c, err := resolver.NewCache([]string{"web"}, resolver.WithViewKeys(r.keys))
	if err != nil {
		t.Fatal(err)
	}
	v1, _ := r.publish(t, t0, 1)
	if v1.Signature == nil {
		t.Fatal("the assembler published an unsigned view")
	}
	if err := c.ApplyView(v1); err != nil {
		t.Fatalf("signed view refused: %v", err)
	}
	r.in[0].State, r.in[0].Weight = eligibility.Ineligible, 0
	_, d2 := r.publish(t, t0.Add(time.Hour), 1)
	if err := c.ApplyDelta(*d2); err != nil {
		t.Fatalf("signed withdrawal delta refused: %v", err)
	}
	_, d3 := r.publish(t, t0.Add(2*time.Hour), 0.5)
	if len(d3.Zones) == 0 || len(d3.Upserts) != 0 || len(d3.Removals) != 0 {
		t.Fatalf("want a delta of zones only, got %+v", d3)
	}
	if err := c.ApplyDelta(*d3); err != nil {
		t.Fatalf("signed zones delta refused: %v", err)
	}
	if st := c.Stats(); st.SignatureRefusals != 0 || st.Applied != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// With the region's keys configured, a view or delta not signed by them
// over exactly what it carries is refused, whatever its checksum says,
// and the last-known-good view keeps routing; without keys the unsigned
// one is taken as before.
func TestForgedUpdatesAreRefusedWithKeys(t *testing.T) {
	t.Parallel()
	r := newSigningRegion(t)
	v1, _ := r.publish(t, t0, 1)
	rogue := func(eps []resolver.Endpoint) []resolver.Endpoint {
		out := append([]resolver.Endpoint(nil), eps...)
		for i := range out {
			out[i].Address = "203.0.113.66"
		}
		return out
	}
	_, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	for _, tc := range []struct {
		name  string
		apply func(c *resolver.Cache) error
	}{
		{"unsigned view, valid checksum", func(c *resolver.Cache) error {
			v := v1
			v.Version, v.Endpoints, v.Signature = 99, rogue(v1.Endpoints), nil
			v.Checksum = resolver.Checksum(v.Endpoints)
			return c.ApplyView(v)
		}},
		{"signed view, endpoints and checksum rewritten", func(c *resolver.Cache) error {
			v := v1
			v.Endpoints = rogue(v1.Endpoints)
			v.Checksum = resolver.Checksum(v.Endpoints)
			v.Version++ // a higher version, still v1's signature
			return c.ApplyView(v)
		}},
		{"signed by another key", func(c *resolver.Cache) error {
			v := v1
			v.Version = 99
			sig := *v1.Signature
			sig.Sig = base64.StdEncoding.EncodeToString(ed25519.Sign(otherPriv, []byte("anything")))
			v.Signature = &sig
			return c.ApplyView(v)
		}},
		{"a delta that moves an endpoint, checksum recomputed", func(c *resolver.Cache) error {
			moved := rogue(v1.Endpoints[:1])
			after := append(append([]resolver.Endpoint(nil), moved...), v1.Endpoints[1:]...)
			return c.ApplyDelta(resolver.Delta{Service: "web", FromVersion: v1.Version, Version: v1.Version + 1, Upserts: moved,
				Checksum: resolver.Checksum(after), Signature: v1.Signature, GeneratedAt: t0})
		}},
		{"an unsigned delta", func(c *resolver.Cache) error {
			return c.ApplyDelta(resolver.Delta{Service: "web", FromVersion: v1.Version, Version: v1.Version + 1,
				Removals: []string{v1.Endpoints[0].InstanceID}, Checksum: resolver.Checksum(v1.Endpoints[1:]), GeneratedAt: t0})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := resolver.NewCache([]string{"web"}, resolver.WithViewKeys(r.keys))
			if err != nil {
				t.Fatal(err)
			}
			if err := c.ApplyView(v1); err != nil {
				t.Fatal(err)
			}
			if err := tc.apply(c); !errors.Is(err, resolver.ErrSignature) {
				t.Fatalf("forged update: %v, want ErrSignature", err)
			}
			res, err := c.Resolve("web")
			if err != nil || res.Version() != v1.Version || res.Held != v1.Version {
				t.Fatalf("after the forgery: %+v, %v; want v%d kept", res, err, v1.Version)
			}
			for _, e := range res.Endpoints() {
				if e.Address == "203.0.113.66" {
					t.Fatalf("routing moved to the forger: %+v", e)
				}
			}
			if st := c.Stats(); st.SignatureRefusals != 1 {
				t.Fatalf("SignatureRefusals = %d", st.SignatureRefusals)
			}

			// The same update without keys configured: taken on its
			// checksum, as before (the first case shows it).
			plain, err := resolver.NewCache([]string{"web"})
			if err != nil {
				t.Fatal(err)
			}
			if err := plain.ApplyView(v1); err != nil {
				t.Fatal(err)
			}
			if err := tc.apply(plain); errors.Is(err, resolver.ErrSignature) {
				t.Fatalf("a client without keys checked a signature: %v", err)
			}
		})
	}
}

// A client fed a forged view on its stream keeps what it holds and ends
// the subscription to ask for a full view.
func TestClientResubscribesOnAForgedView(t *testing.T) {
	t.Parallel()
	r := newSigningRegion(t)
	v1, _ := r.publish(t, t0, 1)
	c, err := resolver.StreamClient([]string{"web"}, resolver.WithViewKeys(r.keys))
	if err != nil {
		t.Fatal(err)
	}
	good, _ := json.Marshal(v1)
	forged := v1
	forged.Version, forged.Signature = v1.Version+1, nil
	forged.Endpoints = forged.Endpoints[:1]
	forged.Checksum = resolver.Checksum(forged.Endpoints)
	bad, _ := json.Marshal(forged)
	err = resolver.Feed(c, strings.NewReader("event: view\ndata: "+string(good)+"\n\nevent: view\ndata: "+string(bad)+"\n\n"))
	if !errors.Is(err, resolver.ErrSignature) {
		t.Fatalf("stream ended with %v, want ErrSignature", err)
	}
	res, err := c.Resolve("web")
	if err != nil || res.Version() != v1.Version || len(res.Endpoints()) != len(v1.Endpoints) {
		t.Fatalf("held %+v, %v; want v%d kept", res, err, v1.Version)
	}
}

// LoadViewKeys reads PEM public keys and names them as muster does.
func TestLoadViewKeys(t *testing.T) {
	t.Parallel()
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "region.pub")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, err := resolver.LoadViewKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := keys[resolver.KeyID(pub)]; !ok || !k.Equal(pub) || len(keys) != 1 {
		t.Fatalf("keys %v", keys)
	}
	if _, err := resolver.LoadViewKeys(filepath.Join(t.TempDir(), "none.pub")); err == nil {
		t.Fatal("a missing file loaded")
	}
}
