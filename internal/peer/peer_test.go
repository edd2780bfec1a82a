package peer_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/peer"
	"github.com/musterhq/muster/internal/seal"
)

type key struct {
	id   string
	priv ed25519.PrivateKey
}

func (k key) KeyID() string             { return k.id }
func (k key) Public() ed25519.PublicKey { return k.priv.Public().(ed25519.PublicKey) }
func (k key) Sign(_ context.Context, msg []byte) ([]byte, error) {
	return ed25519.Sign(k.priv, msg), nil
}

func newKey(t *testing.T, id string) key {
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return key{id: id, priv: priv}
}

func TestVerify(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	region, other := newKey(t, "region"), newKey(t, "other")
	s := peer.Signer{ID: "r1", Key: region, Now: clock}
	newVerifier := func(keys seal.Keys) *peer.Verifier {
		return &peer.Verifier{Keys: func() seal.Keys { return keys }, Now: clock}
	}
	signed := func(t *testing.T, s peer.Signer, method, url string, body []byte) *http.Request {
		r, err := http.NewRequest(method, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Sign(context.Background(), r, body); err != nil {
			t.Fatal(err)
		}
		return r
	}
	body := []byte(`{"reports":[]}`)

	v := newVerifier(seal.Keys{}.With(region))
	r := signed(t, s, "POST", "http://a/v1/peer/reports?x=1", body)
	if id, err := v.Verify(r, body); err != nil || id != "r1" {
		t.Fatalf("a signed request: %q, %v", id, err)
	}
	if _, err := v.Verify(r, body); err == nil || !strings.Contains(err.Error(), "replayed") {
		t.Fatalf("the same request again: %v, want replayed", err)
	}

	cases := map[string]func() (*http.Request, []byte, *peer.Verifier){
		"another body": func() (*http.Request, []byte, *peer.Verifier) {
			return signed(t, s, "POST", "http://a/v1/peer/reports", body), []byte(`{"reports":[1]}`), v
		},
		"another path": func() (*http.Request, []byte, *peer.Verifier) {
			r := signed(t, s, "POST", "http://a/v1/peer/reports", body)
			r.URL.Path = "/v1/peer/other"
			return r, body, v
		},
		"another method": func() (*http.Request, []byte, *peer.Verifier) {
			r := signed(t, s, "POST", "http://a/v1/peer/reports", body)
			r.Method = "PUT"
			return r, body, v
		},
		"an untrusted key": func() (*http.Request, []byte, *peer.Verifier) {
			return signed(t, peer.Signer{ID: "r1", Key: other, Now: clock}, "GET", "http://a/v1/peer/updates", nil), nil, v
		},
		"another replica named": func() (*http.Request, []byte, *peer.Verifier) {
			r := signed(t, s, "GET", "http://a/v1/peer/updates", nil)
			r.Header.Set(peer.Header, "r2"+strings.TrimPrefix(r.Header.Get(peer.Header), "r1"))
			return r, nil, v
		},
		"too old": func() (*http.Request, []byte, *peer.Verifier) {
			old := peer.Signer{ID: "r1", Key: region, Now: func() time.Time { return now.Add(-peer.MaxSkew - time.Second) }}
			return signed(t, old, "GET", "http://a/v1/peer/updates", nil), nil, v
		},
		"no header": func() (*http.Request, []byte, *peer.Verifier) {
			r, _ := http.NewRequest("GET", "http://a/v1/peer/updates", nil)
			return r, nil, v
		},
		"a malformed header": func() (*http.Request, []byte, *peer.Verifier) {
			r, _ := http.NewRequest("GET", "http://a/v1/peer/updates", nil)
			r.Header.Set(peer.Header, "r1 x y z")
			return r, nil, v
		},
		"no keys": func() (*http.Request, []byte, *peer.Verifier) {
			return signed(t, s, "GET", "http://a/v1/peer/updates", nil), nil, newVerifier(nil)
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			r, b, v := c()
			if id, err := v.Verify(r, b); !errors.Is(err, peer.ErrNotPeer) {
				t.Fatalf("accepted as %q (%v), want ErrNotPeer", id, err)
			}
		})
	}

	// A later release may append a part to the header: the signature is
	// still checked, and the part ignored.
	r = signed(t, s, "GET", "http://a/v1/peer/updates?appended=1", nil)
	r.Header.Set(peer.Header, r.Header.Get(peer.Header)+" next-part")
	if id, err := v.Verify(r, nil); err != nil || id != "r1" {
		t.Fatalf("a header with a part appended: %q, %v", id, err)
	}
	r = signed(t, s, "GET", "http://a/v1/peer/updates?appended=2", nil)
	parts := strings.Split(r.Header.Get(peer.Header), " ")
	r.Header.Set(peer.Header, strings.Join(parts[:3], " "))
	if _, err := v.Verify(r, nil); !errors.Is(err, peer.ErrNotPeer) {
		t.Fatalf("a header of three parts: %v, want ErrNotPeer", err)
	}

	// A rotation: a request signed with the new key is accepted by a
	// replica that trusts both.
	both := newVerifier(seal.Keys{}.With(region).With(other))
	if _, err := both.Verify(signed(t, peer.Signer{ID: "r2", Key: other, Now: clock}, "GET", "http://a/v1/peer/updates", nil), nil); err != nil {
		t.Fatalf("a request under the other trusted key: %v", err)
	}
}

// Two replicas whose clocks are 30 s (or 90 s) apart still talk, in both
// directions; a request is refused as replayed for as long as its
// signing time is fresh on the receiver's clock, and as stale after; and
// SignedAt gives the receiver the sender's clock at signing.
func TestVerifyAcrossSkewedClocks(t *testing.T) {
	region := newKey(t, "region")
	base := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	var recvNow time.Time
	v := &peer.Verifier{Keys: func() seal.Keys { return seal.Keys{}.With(region) }, Now: func() time.Time { return recvNow }}
	for _, skew := range []time.Duration{30 * time.Second, -30 * time.Second, 90 * time.Second, -90 * time.Second} {
		recvNow = base
		sendNow := base.Add(skew)
		s := peer.Signer{ID: "r1", Key: region, Now: func() time.Time { return sendNow }}
		r, err := http.NewRequest("GET", "http://a/v1/peer/updates?skew="+skew.String(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Sign(context.Background(), r, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := v.Verify(r, nil); err != nil {
			t.Fatalf("sender %s from the receiver: %v", skew, err)
		}
		at, ok := peer.SignedAt(r)
		if !ok || !at.Equal(sendNow) {
			t.Fatalf("SignedAt = %v, %v; want the sender's clock %v", at, ok, sendNow)
		}
		// Replayed at any moment its signature is still fresh here.
		for _, later := range []time.Duration{time.Second, peer.MaxSkew/2 + skew} {
			recvNow = sendNow.Add(later)
			if d := recvNow.Sub(sendNow); d > peer.MaxSkew || d < -peer.MaxSkew {
				continue
			}
			if _, err := v.Verify(r, nil); err == nil || !strings.Contains(err.Error(), "replayed") {
				t.Fatalf("skew %s: replayed %s after signing: %v, want replayed", skew, later, err)
			}
		}
		recvNow = sendNow.Add(peer.MaxSkew + time.Second)
		if _, err := v.Verify(r, nil); err == nil || strings.Contains(err.Error(), "replayed") {
			t.Fatalf("skew %s: replayed past the window: %v, want refused as too far off", skew, err)
		}
	}
}
