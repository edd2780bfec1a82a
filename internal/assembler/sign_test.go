package assembler_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/assembler"
)

// testKey is an Ed25519 key with its id, as the region's key would be.
type testKey struct {
	id   string
	priv ed25519.PrivateKey
}

func newKey(t testing.TB, id string) testKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return testKey{id: id, priv: priv}
}

func (k testKey) keys() map[string]ed25519.PublicKey {
	return map[string]ed25519.PublicKey{k.id: k.priv.Public().(ed25519.PublicKey)}
}

func (k testKey) signer(replica string) assembler.ViewSigner {
	return assembler.SignWith(replica, k.id, func(msg []byte) ([]byte, error) { return ed25519.Sign(k.priv, msg), nil }, nil)
}

// signedView publishes one view of "s" through an assembler signing with k
// as replica "r1", and decodes it as a peer would.
func signedView(t *testing.T, k testKey) (*assembler.View, assembler.Published) {
	t.Helper()
	a := assembler.New(assembler.Options{Sign: k.signer("r1")})
	vs := &versions{}
	a.Update(svc("s", 0.5, zoned(1, elig, 2, "a", "b")), t0)
	p := settle(t, a, t0, vs)[0]
	var v assembler.View
	if err := json.Unmarshal(p.ViewJSON, &v); err != nil {
		t.Fatal(err)
	}
	return &v, p
}

// The signature covers the service, the version, the endpoints (through
// their recomputed checksum), the zones and the signing replica: changing
// any of them makes it fail; the untouched view verifies.
func TestViewSignatureCoversEveryField(t *testing.T) {
	t.Parallel()
	k := newKey(t, "k1")
	v, _ := signedView(t, k)
	if v.Signature == nil || v.Signature.Replica != "r1" || v.Signature.KeyID != "k1" {
		t.Fatalf("published view's signature = %+v, want one by r1 with k1", v.Signature)
	}
	if _, err := assembler.VerifyView(k.keys(), v); err != nil {
		t.Fatalf("the published view does not verify: %v", err)
	}
	clone := func() *assembler.View {
		b, _ := json.Marshal(v)
		var c assembler.View
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		return &c
	}
	for _, tc := range []struct {
		name   string
		change func(*assembler.View)
		want   error
	}{
		{"service", func(c *assembler.View) { c.Service = "t" }, assembler.ErrForged},
		{"version", func(c *assembler.View) { c.Version++ }, assembler.ErrForged},
		{"an address, checksum recomputed", func(c *assembler.View) {
			c.Endpoints[0].Address = "203.0.113.66"
			c.Checksum = assembler.Checksum(c.Endpoints)
		}, assembler.ErrForged},
		{"an address, checksum left", func(c *assembler.View) { c.Endpoints[0].Address = "203.0.113.66" }, assembler.ErrForged},
		{"a weight", func(c *assembler.View) {
			c.Endpoints[1].Weight = 0
			c.Checksum = assembler.Checksum(c.Endpoints)
		}, assembler.ErrForged},
		{"an endpoint dropped", func(c *assembler.View) {
			c.Endpoints = c.Endpoints[1:]
			c.Checksum = assembler.Checksum(c.Endpoints)
		}, assembler.ErrForged},
		{"a zone's guard", func(c *assembler.View) {
			z := c.Zones["a"]
			z.Guard = assembler.GuardTripped
			c.Zones["a"] = z
		}, assembler.ErrForged},
		{"a zone's traffic weight", func(c *assembler.View) {
			z := c.Zones["b"]
			z.TrafficWeight = 0
			c.Zones["b"] = z
		}, assembler.ErrForged},
		{"a zone removed", func(c *assembler.View) { delete(c.Zones, "b") }, assembler.ErrForged},
		{"the replica", func(c *assembler.View) { c.Signature.Replica = "r2" }, assembler.ErrForged},
		{"the signature", func(c *assembler.View) {
			raw, _ := base64.StdEncoding.DecodeString(c.Signature.Sig)
			raw[7] ^= 1
			c.Signature.Sig = base64.StdEncoding.EncodeToString(raw)
		}, assembler.ErrForged},
		{"the signature re-spelled", func(c *assembler.View) {
			// The last character before the padding carries 4 unused
			// bits: setting one spells the same bytes differently.
			const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
			s := []byte(c.Signature.Sig)
			i := len(s) - 3
			s[i] = alphabet[strings.IndexByte(alphabet, s[i])|1]
			c.Signature.Sig = string(s)
		}, assembler.ErrForged},
		{"the key id", func(c *assembler.View) { c.Signature.KeyID = "k2" }, assembler.ErrUntrustedKey},
		{"no signature", func(c *assembler.View) { c.Signature = nil }, assembler.ErrUnsigned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := clone()
			tc.change(c)
			if _, err := assembler.VerifyView(k.keys(), c); !errors.Is(err, tc.want) {
				t.Fatalf("VerifyView = %v, want %v", err, tc.want)
			}
		})
	}
	// Another key of the same shape, trusted instead, verifies nothing.
	if _, err := assembler.VerifyView(newKey(t, "k1").keys(), v); !errors.Is(err, assembler.ErrForged) {
		t.Fatalf("VerifyView under another key = %v, want ErrForged", err)
	}
}

// A delta carries the signature of the view it produces, and the view's
// encoding carries it too, as encoding/json would write it.
func TestDeltaCarriesTheViewsSignature(t *testing.T) {
	t.Parallel()
	k := newKey(t, "k1")
	a := assembler.New(assembler.Options{Sign: k.signer("r1")})
	vs := &versions{}
	in := zoned(1, elig, 3, "a")
	a.Update(svc("s", 0.5, in), t0)
	settle(t, a, t0, vs)
	in[0].State, in[0].Weight = inelg, 0
	a.Update(svc("s", 0.5, in), t0.Add(time.Minute))
	p := settle(t, a, t0.Add(time.Minute), vs)[0]
	if p.Delta == nil || p.Delta.Signature == nil || *p.Delta.Signature != *p.View.Signature {
		t.Fatalf("delta's signature %+v, view's %+v: want the same", p.Delta.Signature, p.View.Signature)
	}
	fresh, _ := json.Marshal(p.View)
	if string(fresh) != string(p.ViewJSON) {
		t.Fatalf("encoding differs from encoding/json's:\n%s\n%s", fresh, p.ViewJSON)
	}
	var d assembler.Delta
	if err := json.Unmarshal(p.DeltaJSON, &d); err != nil || d.Signature == nil || *d.Signature != *p.View.Signature {
		t.Fatalf("decoded delta's signature %+v (%v), want the view's", d.Signature, err)
	}
}

// Without a signer views are unsigned, as before: no signature field at
// all, so their bytes are what an earlier release published.
func TestUnsignedWithoutSigner(t *testing.T) {
	t.Parallel()
	a := assembler.New(assembler.Options{})
	a.Update(svc("s", 0.5, zoned(1, elig, 2, "a")), t0)
	p := settle(t, a, t0, &versions{})[0]
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(p.ViewJSON, &raw); err != nil {
		t.Fatal(err)
	}
	if _, ok := raw["signature"]; ok || p.View.Signature != nil {
		t.Fatalf("an unsigned view carries a signature: %s", p.ViewJSON)
	}
}

// BenchmarkRegionSteadySigned is BenchmarkRegionSteady with every version
// signed (Ed25519, a local key): the cost of signing at publication.
func BenchmarkRegionSteadySigned(b *testing.B) {
	benchRegionOpts(b, 2_500, assembler.Options{Sign: newKey(b, "k").signer("r1")})
}

// BenchmarkRegionEvacuationSigned is BenchmarkRegionEvacuation, signed.
func BenchmarkRegionEvacuationSigned(b *testing.B) {
	benchRegionOpts(b, 40_000, assembler.Options{Sign: newKey(b, "k").signer("r1")})
}

// BenchmarkSignView is one signature: the zones digest and Ed25519.
func BenchmarkSignView(b *testing.B) {
	sign := newKey(b, "k").signer("r1")
	zones := map[string]assembler.ZoneStatus{
		"a": {Guard: "ok", Eligible: 40, Total: 44, Registered: 44, MinHealthyFraction: 0.5, TrafficWeight: 1},
		"b": {Guard: "ok", Eligible: 44, Total: 44, Registered: 44, MinHealthyFraction: 0.5, TrafficWeight: 1},
		"c": {Guard: "ok", Eligible: 43, Total: 44, Registered: 44, MinHealthyFraction: 0.5, TrafficWeight: 1},
	}
	sum := assembler.Checksum(nil)
	for b.Loop() {
		if sign("svc-001", 1<<31+42, sum, assembler.ZonesDigest(zones)) == nil {
			b.Fatal("not signed")
		}
	}
}
