package server_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/forward"
	"github.com/musterhq/muster/internal/peer"
)

// TestACapturedPeerRequestIsRefused: a request replica c sent to a (POST
// /v1/peer/reports, signed for a), captured on the way, is refused when
// sent again: the same bytes to a (replayed), its signature re-encoded
// (malformed), and sent to b (wrong_receiver), each answered 401, applied
// nowhere and counted in muster_peer_requests_refused_total by reason;
// so is a request signed the release before's way (legacy) and one with
// no signature (missing).
func TestACapturedPeerRequestIsRefused(t *testing.T) {
	t.Parallel()
	a := apptest.New(t, apptest.Options{Replica: "a"})
	b := apptest.New(t, apptest.Options{Replica: "b", Pool: a.Pool})
	a.Seed(t)
	in := registerOnHost(t, a, 9000)
	for _, s := range []*stack{a, b} {
		s.SyncNow(t)
	}
	body, err := json.Marshal(forward.Body{Batches: []forward.Batch{{
		Actor:   forward.Actor{Kind: "workload", Service: "web", Subject: "web", Home: true},
		Reports: []evaluator.Report{{InstanceID: in.ID, Class: "self", Outcome: "success"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	c := peer.Signer{ID: "c", Key: apptest.SealKey()}
	req, _ := http.NewRequest(http.MethodPost, a.URL+forward.Path, bytes.NewReader(body))
	if err := c.Sign(t.Context(), req, "a", body); err != nil {
		t.Fatal(err)
	}
	captured := req.Header.Get(peer.Header)
	send := func(s *stack, h http.Header) apptest.Response {
		t.Helper()
		return peerPost(t, s, nil, nil, body, h)
	}
	applied := func(s *stack) float64 {
		return labelled(t, s, "muster_samples_forwarded_total", "result", "accepted") + labelled(t, s, "muster_samples_forwarded_total", "result", "refused")
	}
	if r := send(a, http.Header{peer.Header: {captured}}); r.Status != http.StatusOK {
		t.Fatalf("the request itself: %d %s", r.Status, r.Body)
	}
	if n := applied(a); n != 1 {
		t.Fatalf("a applied %v items, want 1", n)
	}

	sig := captured[strings.LastIndexByte(captured, ' ')+1:]
	raw, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		t.Fatal(err)
	}
	head := captured[:strings.LastIndexByte(captured, ' ')+1]
	// The last character's 4 unused bits set: the same 64 bytes to a
	// lenient decoder.
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, sig[len(sig)-1])
	lenient := sig[:len(sig)-1] + string(alphabet[last|1])
	for _, tc := range []struct {
		name   string
		to     *stack
		header http.Header
		reason string
	}{
		{"the same bytes again", a, http.Header{peer.Header: {captured}}, peer.ReasonReplayed},
		{"the signature with its unused bits set", a, http.Header{peer.Header: {head + lenient}}, peer.ReasonMalformed},
		{"the signature padded", a, http.Header{peer.Header: {captured + "=="}}, peer.ReasonMalformed},
		{"the signature in standard base64", a, http.Header{peer.Header: {head + base64.StdEncoding.EncodeToString(raw)}}, peer.ReasonMalformed},
		{"sent to another replica", b, http.Header{peer.Header: {captured}}, peer.ReasonWrongReceiver},
		{"the release before's header only", a, http.Header{peer.HeaderV1: {"c 1 k " + sig}}, peer.ReasonLegacy},
		{"no signature", a, nil, peer.ReasonMissing},
	} {
		before := labelled(t, tc.to, "muster_peer_requests_refused_total", "reason", tc.reason)
		r := send(tc.to, tc.header)
		if r.Status != http.StatusUnauthorized {
			t.Errorf("%s: %d %s, want 401", tc.name, r.Status, r.Body)
			continue
		}
		if got := labelled(t, tc.to, "muster_peer_requests_refused_total", "reason", tc.reason); got != before+1 {
			t.Errorf("%s: muster_peer_requests_refused_total{reason=%s} went from %v to %v, want one more", tc.name, tc.reason, before, got)
		}
	}
	if n := applied(a) + applied(b); n != 1 {
		t.Errorf("%v items applied in all, want the one of the request itself", n)
	}
}
