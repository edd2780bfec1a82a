package peer_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

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

func newKey(t testing.TB, id string) key {
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return key{id: id, priv: priv}
}

func signed(t *testing.T, s peer.Signer, method, url, to string, body []byte) *http.Request {
	t.Helper()
	r, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Sign(context.Background(), r, to, body); err != nil {
		t.Fatal(err)
	}
	return r
}

// clone copies r with its headers, as a captured request replayed.
func clone(r *http.Request) *http.Request {
	c := r.Clone(context.Background())
	c.Header = r.Header.Clone()
	return c
}

func TestVerify(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	region, other := newKey(t, "region"), newKey(t, "other")
	s := peer.Signer{ID: "r1", Key: region, Now: clock}
	newVerifier := func(keys seal.Keys) *peer.Verifier {
		return &peer.Verifier{Keys: func() seal.Keys { return keys }, Self: []string{"r2", "https://r2:8080"}, Now: clock}
	}
	body := []byte(`{"reports":[]}`)

	v := newVerifier(seal.Keys{}.With(region))
	r := signed(t, s, "POST", "http://a/v1/peer/reports?x=1", "r2", body)
	if r.Header.Get(peer.HeaderV1) != "" {
		t.Errorf("a strict signer sent %s: %q", peer.HeaderV1, r.Header.Get(peer.HeaderV1))
	}
	if id, err := v.Verify(r, body); err != nil || id != "r1" {
		t.Fatalf("a signed request: %q, %v", id, err)
	}
	if at, ok := peer.SignedAt(r); !ok || !at.Equal(now) {
		t.Errorf("SignedAt = %v, %v; want %v", at, ok, now)
	}
	// Known by its advertised URL (a configured peer).
	if id, err := v.Verify(signed(t, s, "GET", "http://a/v1/peer/authz", "https://r2:8080", nil), nil); err != nil || id != "r1" {
		t.Fatalf("a request to the receiver's URL: %q, %v", id, err)
	}

	cases := map[string]struct {
		reason string
		req    func() (*http.Request, []byte, *peer.Verifier)
	}{
		"another body": {peer.ReasonBadSignature, func() (*http.Request, []byte, *peer.Verifier) {
			return signed(t, s, "POST", "http://a/v1/peer/reports", "r2", body), []byte(`{"reports":[1]}`), v
		}},
		"another path": {peer.ReasonBadSignature, func() (*http.Request, []byte, *peer.Verifier) {
			r := signed(t, s, "POST", "http://a/v1/peer/reports", "r2", body)
			r.URL.Path = "/v1/peer/other"
			return r, body, v
		}},
		"another query": {peer.ReasonBadSignature, func() (*http.Request, []byte, *peer.Verifier) {
			r := signed(t, s, "GET", "http://a/v1/peer/updates?a=1", "r2", nil)
			r.URL.RawQuery = "a=2"
			return r, nil, v
		}},
		"another method": {peer.ReasonBadSignature, func() (*http.Request, []byte, *peer.Verifier) {
			r := signed(t, s, "POST", "http://a/v1/peer/reports", "r2", body)
			r.Method = "PUT"
			return r, body, v
		}},
		"an untrusted key": {peer.ReasonUntrustedKey, func() (*http.Request, []byte, *peer.Verifier) {
			return signed(t, peer.Signer{ID: "r1", Key: other, Now: clock}, "GET", "http://a/v1/peer/updates", "r2", nil), nil, v
		}},
		"another sender named": {peer.ReasonBadSignature, func() (*http.Request, []byte, *peer.Verifier) {
			r := signed(t, s, "GET", "http://a/v1/peer/updates", "r2", nil)
			r.Header.Set(peer.Header, "r3"+strings.TrimPrefix(r.Header.Get(peer.Header), "r1"))
			return r, nil, v
		}},
		"the receiver renamed in the header": {peer.ReasonBadSignature, func() (*http.Request, []byte, *peer.Verifier) {
			r := signed(t, s, "GET", "http://a/v1/peer/updates", "r9", nil)
			r.Header.Set(peer.Header, strings.Replace(r.Header.Get(peer.Header), " r9 ", " r2 ", 1))
			return r, nil, v
		}},
		"another receiver": {peer.ReasonWrongReceiver, func() (*http.Request, []byte, *peer.Verifier) {
			return signed(t, s, "GET", "http://a/v1/peer/updates", "r3", nil), nil, v
		}},
		"too old": {peer.ReasonStale, func() (*http.Request, []byte, *peer.Verifier) {
			old := peer.Signer{ID: "r1", Key: region, Now: func() time.Time { return now.Add(-peer.MaxSkew - time.Second) }}
			return signed(t, old, "GET", "http://a/v1/peer/updates", "r2", nil), nil, v
		}},
		"no header": {peer.ReasonMissing, func() (*http.Request, []byte, *peer.Verifier) {
			r, _ := http.NewRequest("GET", "http://a/v1/peer/updates", nil)
			return r, nil, v
		}},
		"a malformed header": {peer.ReasonMalformed, func() (*http.Request, []byte, *peer.Verifier) {
			r, _ := http.NewRequest("GET", "http://a/v1/peer/updates", nil)
			r.Header.Set(peer.Header, "r1 r2 x y z w")
			return r, nil, v
		}},
		"a part appended": {peer.ReasonMalformed, func() (*http.Request, []byte, *peer.Verifier) {
			r := signed(t, s, "GET", "http://a/v1/peer/updates?appended=1", "r2", nil)
			r.Header.Set(peer.Header, r.Header.Get(peer.Header)+" next-part")
			return r, nil, v
		}},
		"two headers": {peer.ReasonMalformed, func() (*http.Request, []byte, *peer.Verifier) {
			r := signed(t, s, "GET", "http://a/v1/peer/updates?two=1", "r2", nil)
			r.Header.Add(peer.Header, r.Header.Get(peer.Header))
			return r, nil, v
		}},
		"no keys": {peer.ReasonUntrustedKey, func() (*http.Request, []byte, *peer.Verifier) {
			return signed(t, s, "GET", "http://a/v1/peer/updates", "r2", nil), nil, newVerifier(nil)
		}},
		"only the release before's header": {peer.ReasonLegacy, func() (*http.Request, []byte, *peer.Verifier) {
			r := signed(t, peer.Signer{ID: "r1", Key: region, Now: clock, V1: true}, "GET", "http://a/v1/peer/updates?v1=1", "r2", nil)
			r.Header.Del(peer.Header)
			return r, nil, v
		}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			r, b, v := c.req()
			id, err := v.Verify(r, b)
			if !errors.Is(err, peer.ErrNotPeer) {
				t.Fatalf("accepted as %q (%v), want ErrNotPeer", id, err)
			}
			if got := peer.Reason(err); got != c.reason {
				t.Fatalf("refused %q (%v), want %q", got, err, c.reason)
			}
		})
	}

	// A rotation: a request signed with the new key is accepted by a
	// replica that trusts both.
	both := newVerifier(seal.Keys{}.With(region).With(other))
	if _, err := both.Verify(signed(t, peer.Signer{ID: "r3", Key: other, Now: clock}, "GET", "http://a/v1/peer/updates", "r2", nil), nil); err != nil {
		t.Fatalf("a request under the other trusted key: %v", err)
	}
}

// TestACapturedRequestIsRefused: a request captured on its way and sent
// again is refused and counted by reason: the same bytes (replayed),
// its signature spelled another way (every other base64 text of the same
// 64 bytes: malformed), a nonce used again under another signature
// (replayed), and the request sent to another replica (wrong_receiver).
func TestACapturedRequestIsRefused(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	region := newKey(t, "region")
	reg := prometheus.NewRegistry()
	refused, err := peer.NewRefusedCounter(reg)
	if err != nil {
		t.Fatal(err)
	}
	keys := func() seal.Keys { return seal.Keys{}.With(region) }
	b := &peer.Verifier{Keys: keys, Self: []string{"b"}, Now: clock, Refused: refused}
	c := &peer.Verifier{Keys: keys, Self: []string{"c"}, Now: clock, Refused: refused}
	a := peer.Signer{ID: "a", Key: region, Now: clock}
	body := []byte(`{"batches":[]}`)
	captured := signed(t, a, "POST", "http://b/v1/peer/reports", "b", body)
	if _, err := b.Verify(clone(captured), body); err != nil {
		t.Fatalf("the request itself: %v", err)
	}
	count := func(reason string) float64 { return testutil.ToFloat64(refused.WithLabelValues(reason)) }

	// The same bytes, again and again.
	for range 3 {
		if _, err := b.Verify(clone(captured), body); peer.Reason(err) != peer.ReasonReplayed {
			t.Fatalf("the same bytes again: %v, want replayed", err)
		}
	}
	if n := count(peer.ReasonReplayed); n != 3 {
		t.Errorf("replayed counted %v, want 3", n)
	}

	// The signature's last character carries 4 unused bits: 15 other
	// texts decode to the same 64 bytes without Strict, and padding or a
	// line break give more. Every one is refused before it is looked up.
	h := captured.Header.Get(peer.Header)
	sigText := h[strings.LastIndexByte(h, ' ')+1:]
	sig, err := base64.RawURLEncoding.DecodeString(sigText)
	if err != nil {
		t.Fatal(err)
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	var respelled []string
	last := strings.IndexByte(alphabet, sigText[len(sigText)-1])
	for i := range 16 {
		if alt := sigText[:len(sigText)-1] + string(alphabet[last&^15|i]); alt != sigText {
			respelled = append(respelled, alt)
		}
	}
	respelled = append(respelled, sigText+"==", sigText[:40]+"\n"+sigText[40:], base64.StdEncoding.EncodeToString(sig))
	for _, alt := range respelled {
		if d, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(alt, "=")); err == nil && !bytes.Equal(d, sig) && !strings.Contains(alt, "+") && !strings.Contains(alt, "/") {
			t.Fatalf("%q is not the same signature", alt)
		}
		r := clone(captured)
		r.Header.Set(peer.Header, h[:strings.LastIndexByte(h, ' ')+1]+alt)
		if _, err := b.Verify(r, body); peer.Reason(err) != peer.ReasonMalformed {
			t.Fatalf("the signature spelled %q: %v, want malformed", alt, err)
		}
	}
	if n := count(peer.ReasonMalformed); n != float64(len(respelled)) {
		t.Errorf("malformed counted %v, want %d", n, len(respelled))
	}

	// Sent to another replica: c refuses it, whatever b did with it.
	if _, err := c.Verify(clone(captured), body); peer.Reason(err) != peer.ReasonWrongReceiver {
		t.Fatalf("at another replica: %v, want wrong_receiver", err)
	}
	if n := count(peer.ReasonWrongReceiver); n != 1 {
		t.Errorf("wrong_receiver counted %v, want 1", n)
	}

	// A nonce drawn twice (a broken random source) names one request:
	// the second is refused though its signature is new.
	fixed := peer.Signer{ID: "a", Key: region, Now: clock, Rand: bytes.NewReader(bytes.Repeat([]byte{7}, 32))}
	if _, err := b.Verify(signed(t, fixed, "GET", "http://b/v1/peer/updates?n=1", "b", nil), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Verify(signed(t, fixed, "GET", "http://b/v1/peer/updates?n=2", "b", nil), nil); peer.Reason(err) != peer.ReasonReplayed {
		t.Fatalf("another request under a nonce seen: %v, want replayed", err)
	}
}

// TestUpgradeMode: a signer in upgrade mode sends the release before's
// header beside its own; a strict receiver reads only the new one, a
// receiver in upgrade mode accepts either, and the old header of a
// request it accepted cannot be replayed alone.
func TestUpgradeMode(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	region := newKey(t, "region")
	keys := func() seal.Keys { return seal.Keys{}.With(region) }
	reg := prometheus.NewRegistry()
	accepted, err := peer.NewAcceptedCounter(reg)
	if err != nil {
		t.Fatal(err)
	}
	strict := &peer.Verifier{Keys: keys, Self: []string{"b"}, Now: clock}
	upgrade := &peer.Verifier{Keys: keys, Self: []string{"b"}, Now: clock, AcceptV1: true, Accepted: accepted}
	both := peer.Signer{ID: "a", Key: region, Now: clock, V1: true}

	r := signed(t, both, "GET", "http://b/v1/peer/updates", "b", nil)
	if r.Header.Get(peer.HeaderV1) == "" || r.Header.Get(peer.Header) == "" {
		t.Fatalf("an upgrade-mode signer's headers: %v", r.Header)
	}
	if _, err := strict.Verify(clone(r), nil); err != nil {
		t.Fatalf("a strict receiver: %v", err)
	}
	if _, err := upgrade.Verify(clone(r), nil); err != nil {
		t.Fatalf("an upgrade-mode receiver: %v", err)
	}
	stripped := clone(r)
	stripped.Header.Del(peer.Header)
	if _, err := upgrade.Verify(stripped, nil); peer.Reason(err) != peer.ReasonReplayed {
		t.Fatalf("its v1 header alone, replayed: %v, want replayed", err)
	}

	// A replica of the release before signs v1 only.
	old := signed(t, both, "POST", "http://b/v1/peer/reports?old=1", "b", []byte("{}"))
	old.Header.Del(peer.Header)
	if _, err := strict.Verify(clone(old), []byte("{}")); peer.Reason(err) != peer.ReasonLegacy {
		t.Fatalf("v1 only at a strict receiver: %v, want legacy", err)
	}
	if id, err := upgrade.Verify(clone(old), []byte("{}")); err != nil || id != "a" {
		t.Fatalf("v1 only in upgrade mode: %q, %v", id, err)
	}
	if at, ok := peer.SignedAt(old); !ok || !at.Equal(now) {
		t.Errorf("SignedAt of a v1 request = %v, %v", at, ok)
	}
	if _, err := upgrade.Verify(clone(old), []byte("{}")); peer.Reason(err) != peer.ReasonReplayed {
		t.Fatalf("a v1 request again: %v, want replayed", err)
	}
	// The release before's parts after the fourth are ignored, as it did.
	appended := signed(t, both, "GET", "http://b/v1/peer/updates?old=2", "b", nil)
	appended.Header.Del(peer.Header)
	appended.Header.Set(peer.HeaderV1, appended.Header.Get(peer.HeaderV1)+" extra")
	if _, err := upgrade.Verify(appended, nil); err != nil {
		t.Fatalf("a v1 header with a part appended: %v", err)
	}
	if v1, v2 := testutil.ToFloat64(accepted.WithLabelValues("v1")), testutil.ToFloat64(accepted.WithLabelValues("v2")); v1 != 2 || v2 != 1 {
		t.Errorf("accepted v1 %v, v2 %v; want 2 and 1", v1, v2)
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
	v := &peer.Verifier{Keys: func() seal.Keys { return seal.Keys{}.With(region) }, Self: []string{"r2"}, Now: func() time.Time { return recvNow }}
	for _, skew := range []time.Duration{30 * time.Second, -30 * time.Second, 90 * time.Second, -90 * time.Second} {
		recvNow = base
		sendNow := base.Add(skew)
		s := peer.Signer{ID: "r1", Key: region, Now: func() time.Time { return sendNow }}
		r := signed(t, s, "GET", "http://a/v1/peer/updates?skew="+skew.String(), "r2", nil)
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
			if _, err := v.Verify(r, nil); peer.Reason(err) != peer.ReasonReplayed {
				t.Fatalf("skew %s: replayed %s after signing: %v, want replayed", skew, later, err)
			}
		}
		recvNow = sendNow.Add(peer.MaxSkew + time.Second)
		if _, err := v.Verify(r, nil); peer.Reason(err) != peer.ReasonStale {
			t.Fatalf("skew %s: replayed past the window: %v, want stale", skew, err)
		}
	}
}

// TestTheReplayCacheIsBounded: past MaxSeen requests remembered, the
// oldest are forgotten, and a replay of one forgotten is refused as
// stale, never accepted; requests signed after them still pass.
func TestTheReplayCacheIsBounded(t *testing.T) {
	region := newKey(t, "region")
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	v := &peer.Verifier{Keys: func() seal.Keys { return seal.Keys{}.With(region) }, Self: []string{"b"}, MaxSeen: 10,
		Now: func() time.Time { return now }}
	var sent []*http.Request
	for i := range 25 {
		at := now.Add(time.Duration(i) * time.Millisecond)
		r := signed(t, peer.Signer{ID: "a", Key: region, Now: func() time.Time { return at }}, "GET", "http://b/v1/peer/updates", "b", nil)
		if _, err := v.Verify(clone(r), nil); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		sent = append(sent, r)
	}
	for i, r := range sent {
		_, err := v.Verify(clone(r), nil)
		if err == nil {
			t.Fatalf("request %d replayed was accepted", i)
		}
		if why := peer.Reason(err); why != peer.ReasonReplayed && why != peer.ReasonStale {
			t.Fatalf("request %d replayed: %v, want replayed or stale", i, err)
		}
	}
	if _, err := v.Verify(sent[0], nil); peer.Reason(err) != peer.ReasonStale {
		t.Errorf("the oldest replayed: %v, want stale (forgotten)", err)
	}
	later := now.Add(time.Second)
	if _, err := v.Verify(signed(t, peer.Signer{ID: "a", Key: region, Now: func() time.Time { return later }}, "GET", "http://b/v1/peer/updates", "b", nil), nil); err != nil {
		t.Fatalf("a fresh request past the bound: %v", err)
	}
}

// FuzzParseHeader: the parser never panics, and what it accepts is the
// one text its fields encode to (so no two texts carry one signature).
func FuzzParseHeader(f *testing.F) {
	region := newKey(f, "0123abcd")
	r, _ := http.NewRequest("GET", "http://b/v1/peer/updates", nil)
	if err := (peer.Signer{ID: "a", Key: region}).Sign(context.Background(), r, "https://b:8080", nil); err != nil {
		f.Fatal(err)
	}
	good := r.Header.Get(peer.Header)
	f.Add(good)
	f.Add(good + " ")
	f.Add(strings.Replace(good, " ", "  ", 1))
	f.Add(good[:len(good)-1] + "B")
	f.Add("a b 0 AAAAAAAAAAAAAAAAAAAAAA k " + strings.Repeat("A", 86))
	f.Add("a b -1 AAAAAAAAAAAAAAAAAAAAAA k " + strings.Repeat("A", 86))
	f.Add("a b 01 AAAAAAAAAAAAAAAAAAAAAA== k " + strings.Repeat("A", 86))
	f.Add("")
	f.Add("\x00 \xff 9999999999999999999 x y z")
	f.Fuzz(func(t *testing.T, h string) {
		s, err := peer.ParseHeader(h)
		if err != nil {
			return
		}
		if s.String() != h {
			t.Fatalf("accepted %q, which encodes as %q", h, s.String())
		}
		if !peer.ValidName(s.Sender) || !peer.ValidName(s.Receiver) || !peer.ValidName(s.KeyID) || s.At < 0 {
			t.Fatalf("accepted %q with fields %+v", h, s)
		}
	})
}

// BenchmarkVerify verifies distinct requests, each remembered, and
// reports what a remembered request costs in memory (the heap's growth
// over the run, divided by b.N; the cache is capped at DefaultMaxSeen):
//
//	go test -run '^$' -bench BenchmarkVerify -benchtime 100000x ./internal/peer/
func BenchmarkVerify(b *testing.B) {
	region := newKey(b, "region")
	now := time.Now()
	s := peer.Signer{ID: "a", Key: region, Now: func() time.Time { return now }}
	reqs := make([]*http.Request, b.N)
	for i := range reqs {
		r, _ := http.NewRequest("POST", "http://b/v1/peer/reports", nil)
		if err := s.Sign(context.Background(), r, "b", nil); err != nil {
			b.Fatal(err)
		}
		reqs[i] = r
	}
	v := &peer.Verifier{Keys: func() seal.Keys { return seal.Keys{}.With(region) }, Self: []string{"b"}, Now: func() time.Time { return now }}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for _, r := range reqs {
		if _, err := v.Verify(r, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(b.N), "heap-bytes/remembered")
	runtime.KeepAlive(v)
	runtime.KeepAlive(reqs)
}
