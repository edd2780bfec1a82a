package identity_test

import (
	"testing"
	"time"

	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
)

// TestVerifiedTokensAreKnown: a token accepted once is Known (no
// signature check) until it expires or 5 minutes pass, whichever comes
// first; a token never accepted, a refused one and an expired one are not.
func TestVerifiedTokensAreKnown(t *testing.T) {
	t.Parallel()
	s := newDevServer(t)
	clock := newFakeClock()
	v := newVerifier(t, clock, identity.IssuerConfig{URL: s.URL()})

	long := s.mint(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web", TTL: time.Hour}, clock.Now())
	short := s.mint(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "api", TTL: 2 * time.Minute}, clock.Now())
	if _, ok := v.Known(long); ok {
		t.Fatal("a token never presented is known")
	}
	for _, tok := range []string{long, short} {
		if _, err := v.Verify(t.Context(), tok); err != nil {
			t.Fatal(err)
		}
	}
	if p, ok := v.Known(long); !ok || p.Service != "web" {
		t.Fatalf("after verifying it: Known = %+v %t", p, ok)
	}
	if _, ok := v.Known(long + "x"); ok {
		t.Fatal("a tampered token is known")
	}
	if _, err := v.Verify(t.Context(), long[:len(long)-4]+"AAAA"); err == nil {
		t.Fatal("a tampered token verified")
	}

	// The short token's expiry ends its reuse before the 5 minutes do,
	// and Verify refuses it then (the cache does not outlive a token).
	clock.Advance(2*time.Minute + time.Second)
	if _, ok := v.Known(short); ok {
		t.Fatal("an expired token is known")
	}
	if _, err := v.Verify(t.Context(), short); err == nil {
		t.Fatal("an expired token verified from the cache")
	}
	if _, ok := v.Known(long); !ok {
		t.Fatal("the hour-long token was forgotten after 2 minutes")
	}
	// Past 5 minutes the long token is judged afresh (and accepted again).
	clock.Advance(3 * time.Minute)
	if _, ok := v.Known(long); ok {
		t.Fatal("a token verified over 5 minutes ago is known")
	}
	if _, err := v.Verify(t.Context(), long); err != nil {
		t.Fatal(err)
	}
	if _, ok := v.Known(long); !ok {
		t.Fatal("verified again, the token is not known")
	}
}
