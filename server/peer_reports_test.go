package server_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/app"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/forward"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/peer"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/server"
)

// labelled reads the counter or gauge of name whose label has value
// (0 when there is none).
func labelled(t *testing.T, s *stack, name, label, value string) float64 {
	t.Helper()
	return s.Metric(t, name, label, value)
}

// peerPost sends body to s's POST /v1/peer/reports, signed by signer
// over signed (nil: unsigned), with extra headers.
func peerPost(t *testing.T, s *stack, signer *peer.Signer, signed, body []byte, h http.Header) apptest.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.URL+forward.Path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range h {
		req.Header[k] = vs
	}
	if signer != nil {
		if err := signer.Sign(t.Context(), req, s.URL, signed); err != nil {
			t.Fatal(err)
		}
	}
	res, err := s.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return apptest.Response{Status: res.StatusCode, Header: res.Header, Body: b}
}

type otherKey struct{ priv ed25519.PrivateKey }

func (k otherKey) KeyID() string             { return "other" }
func (k otherKey) Public() ed25519.PublicKey { return k.priv.Public().(ed25519.PublicKey) }
func (k otherKey) Sign(_ context.Context, msg []byte) ([]byte, error) {
	return ed25519.Sign(k.priv, msg), nil
}

// TestPeerReportsNeedAReplicaSignature (issue 27): POST /v1/peer/reports
// is for replicas of the region only. Unsigned (even with an admin's
// bearer token), signed with a key the region does not trust, signed over
// another body, or replayed, it is refused 401 problem+json, counted as an
// authentication failure, and applies nothing; signed with the region's
// key it applies the evidence as its actor's, without the source-address
// proof the sending replica made. A malformed or invalid body, signed,
// is refused whole.
func TestPeerReportsNeedAReplicaSignature(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	in := registerOnHost(t, s, 9000) // web at 127.0.0.1, with a credential
	body, err := json.Marshal(forward.Body{Batches: []forward.Batch{{
		Actor:   forward.Actor{Kind: "workload", Service: "web", Subject: "web", Home: true},
		Reports: []evaluator.Report{{InstanceID: in.ID, Class: "self", Outcome: "success"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	region := &peer.Signer{ID: "b", Key: apptest.SealKey()}
	_, priv, _ := ed25519.GenerateKey(nil)
	stranger := &peer.Signer{ID: "b", Key: otherKey{priv}}
	bearer := http.Header{"Authorization": {"Bearer " + s.Token(t, adminReq)}}
	applied := func() float64 {
		return labelled(t, s, "muster_samples_forwarded_total", "result", "accepted") + labelled(t, s, "muster_samples_forwarded_total", "result", "refused")
	}

	for _, tc := range []struct {
		name   string
		signer *peer.Signer
		signed []byte
		header http.Header
	}{
		{"unsigned, with an admin's bearer token", nil, nil, bearer},
		{"signed with a key the region does not trust", stranger, body, nil},
		{"signed over another body", region, []byte(`{"batches":[]}`), nil},
	} {
		r := peerPost(t, s, tc.signer, tc.signed, body, tc.header)
		if r.Status != http.StatusUnauthorized {
			t.Fatalf("%s: %d %s", tc.name, r.Status, r.Body)
		}
		if p := r.Problem(t); p.Type != server.ProblemBase+"unauthenticated" {
			t.Errorf("%s: problem %+v", tc.name, p)
		}
	}
	// A forged header: the region's signature of another request.
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/v1/reports", bytes.NewReader(body))
	if err := region.Sign(t.Context(), req, s.URL, body); err != nil {
		t.Fatal(err)
	}
	if r := peerPost(t, s, nil, nil, body, http.Header{peer.Header: {req.Header.Get(peer.Header)}}); r.Status != http.StatusUnauthorized {
		t.Fatalf("a signature of another path: %d %s", r.Status, r.Body)
	}
	if n := applied(); n != 0 {
		t.Fatalf("refused requests applied %v items", n)
	}
	if n := labelled(t, s, "muster_auth_failures_total", "reason", "not_peer"); n != 4 {
		t.Errorf("muster_auth_failures_total{reason=not_peer} = %v, want 4", n)
	}

	// Signed with the region's key: applied, though the request comes
	// from loopback with no credential (the sending replica proved both).
	h := http.Header{}
	sign := func(body []byte) {
		r, _ := http.NewRequest(http.MethodPost, s.URL+forward.Path, bytes.NewReader(body))
		if err := region.Sign(t.Context(), r, s.URL, body); err != nil {
			t.Fatal(err)
		}
		h.Set(peer.Header, r.Header.Get(peer.Header))
	}
	sign(body)
	r := peerPost(t, s, nil, nil, body, h)
	if r.Status != http.StatusOK {
		t.Fatalf("a signed request: %d %s", r.Status, r.Body)
	}
	if got := apptest.Decode[forward.Result](t, r); got.Accepted != 1 || got.Refused != 0 || len(got.Refusals) != 0 {
		t.Fatalf("result %+v", got)
	}
	// The same request again is a replay.
	if r := peerPost(t, s, nil, nil, body, h); r.Status != http.StatusUnauthorized {
		t.Fatalf("a replayed request: %d %s", r.Status, r.Body)
	}
	if n := applied(); n != 1 {
		t.Fatalf("%v items applied, want the one signed request's", n)
	}

	// Signed but bad: refused whole, nothing applied.
	for _, tc := range []struct {
		body   string
		status int
	}{
		{`{"batches":[`, http.StatusBadRequest},
		// The unknown member is ignored (a newer release may add one),
		// the empty body is not.
		{`{"batches":[],"extra":1}`, http.StatusUnprocessableEntity},
		{`{"batches":[]}`, http.StatusUnprocessableEntity},
		{fmt.Sprintf(`{"batches":[{"actor":{"subject":"web","kind":"workload","service":"web"},"reports":[{"instance_id":%q,"class":"self","outcome":"success"}]},{"actor":{"subject":"x","kind":"robot"},"reports":[{"instance_id":%q,"class":"probe","outcome":"success"}]}]}`, in.ID, in.ID), http.StatusUnprocessableEntity},
	} {
		r := peerPost(t, s, region, []byte(tc.body), []byte(tc.body), nil)
		if r.Status != tc.status {
			t.Fatalf("%s: %d %s, want %d", tc.body, r.Status, r.Body, tc.status)
		}
		r.Problem(t)
	}
	if n := applied(); n != 1 {
		t.Fatalf("%v items applied after bad bodies, want still 1", n)
	}
	// The refusals are on the audit record as authentication failures.
	s.AuthFailures.RunOnce(t.Context(), false)
	r = s.Do(t, "GET", "/v1/audit?outcome=refused&action="+audit.ActionAuthRefuse, s.Token(t, adminReq), "", "")
	if r.Status != http.StatusOK || !bytes.Contains(r.Body, []byte("not_peer")) {
		t.Errorf("audit of the refusals: %d %s", r.Status, r.Body)
	}
}

// TestEvidenceReachesTheOtherReplica (issue 27): two replicas on one
// database. A report batch accepted by replica a is ingested there and
// reaches replica b's evaluator through a's forwarder, signed with the
// region's key; the item a refused is not forwarded. b does not forward
// it again.
func TestEvidenceReachesTheOtherReplica(t *testing.T) {
	t.Parallel()
	a := apptest.New(t, apptest.Options{Replica: "a"})
	b := apptest.New(t, apptest.Options{Replica: "b", Pool: a.Pool})
	a.Seed(t)
	in := registerOnHost(t, a, 9000)
	// Each replica reads the region: both are live, each the other's peer.
	for _, s := range []*stack{a, b, a} {
		if err := s.App.Ownership.RunOnce(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []*stack{a, b} {
		s.App.Forwarder.RunOnce(t.Context())
	}
	if err := b.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	verdict := func(s *stack) evaluator.InstanceVerdict {
		t.Helper()
		s.Evaluator.EvaluateNow()
		r := s.Do(t, "GET", "/v1/services/web/eligibility", s.Token(t, adminReq), "", "")
		for _, v := range apptest.Decode[evaluator.ServiceEligibility](t, r).Instances {
			if v.InstanceID == in.ID {
				return v
			}
		}
		t.Fatalf("instance %s not in web's eligibility at %s: %s", in.ID, s.URL, r.Body)
		return evaluator.InstanceVerdict{}
	}
	if v := verdict(b); v.Evidence["self"].LastSampleAt != nil {
		t.Fatalf("b holds self evidence before any report: %+v", v)
	}

	// Its own self-report (from its address, with its credential), and
	// one about an instance that does not exist.
	body := fmt.Sprintf(`{"reports":[{"instance_id":%q,"class":"self","outcome":"success"},{"instance_id":%q,"class":"passive","outcome":"failure"}]}`, in.ID, uuid.Must(uuid.NewV7()))
	r := a.DoWith(t, "POST", "/v1/reports", a.Token(t, webReq), "application/json", body, credentialHeader(in.Credential))
	if r.Status != http.StatusOK {
		t.Fatalf("report to a: %d %s", r.Status, r.Body)
	}
	if res := apptest.Decode[evaluator.Result](t, r); res.Accepted != 1 || len(res.Refused) != 1 {
		t.Fatalf("a's result %+v", res)
	}
	wait.For(t, 10*time.Second, "a's accepted item at b", func() bool {
		return labelled(t, b, "muster_samples_forwarded_total", "result", "accepted") == 1
	})
	if n := labelled(t, b, "muster_samples_forwarded_total", "result", "refused"); n != 0 {
		t.Errorf("b was forwarded %v items it refused; a refused one and should not have sent it", n)
	}
	if v := verdict(b); v.Evidence["self"].LastSampleAt == nil {
		t.Errorf("b's verdict after a's report: %+v, want its self evidence", v)
	}
	if n := labelled(t, a, "muster_evidence_forwarded_total", "peer", "b"); n != 1 {
		t.Errorf("a forwarded %v items to b, want 1", n)
	}
	// b does not send it on: nothing waits at b for a, and a took nothing
	// back.
	if n := b.App.Forwarder.Queued("a") + int(labelled(t, b, "muster_evidence_forwarded_total", "peer", "a")); n != 0 {
		t.Errorf("b forwarded (or queued) %d items it was forwarded", n)
	}
	if n := labelled(t, a, "muster_samples_forwarded_total", "result", "accepted"); n != 0 {
		t.Errorf("a was sent back %v of its own items", n)
	}
}

// TestPeerReportsIgnoreUnknownMembers: during a rolling upgrade a newer
// replica may add members to the evidence it forwards. POST
// /v1/peer/reports applies such a body in full, ignoring the members at
// every level it does not know, and counts the request in
// muster_peer_unknown_fields_total; what it cannot understand (a known
// member of the wrong type, broken JSON, an actor of an unknown kind) is
// still refused whole with problem+json. The public POST /v1/reports
// stays strict.
func TestPeerReportsIgnoreUnknownMembers(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	in := registerOnHost(t, s, 9000)
	region := &peer.Signer{ID: "b", Key: apptest.SealKey()}
	applied := func() float64 {
		return labelled(t, s, "muster_samples_forwarded_total", "result", "accepted") + labelled(t, s, "muster_samples_forwarded_total", "result", "refused")
	}
	unknown := func() float64 {
		return labelled(t, s, "muster_peer_unknown_fields_total", "route", forward.Path)
	}
	newer := fmt.Sprintf(`{"release":"next","batches":[{"actor":{"subject":"web","kind":"workload","service":"web","home":true,"tenure":{"epoch":7}},`+
		`"reports":[{"instance_id":%q,"class":"self","outcome":"success","age_ms":12,"received":{"replica":"b"}}],"via":"b"}]}`, in.ID)
	r := peerPost(t, s, region, []byte(newer), []byte(newer), nil)
	if r.Status != http.StatusOK {
		t.Fatalf("a body with members this release does not know: %d %s", r.Status, r.Body)
	}
	if got := apptest.Decode[forward.Result](t, r); got.Accepted != 1 || got.Refused != 0 || len(got.Refusals) != 0 {
		t.Fatalf("result %+v, want the one report accepted", got)
	}
	if n := unknown(); n != 1 {
		t.Errorf("muster_peer_unknown_fields_total{route=%q} = %v, want 1", forward.Path, n)
	}
	// The same body without them is not counted.
	known := fmt.Sprintf(`{"batches":[{"actor":{"subject":"web","kind":"workload","service":"web","home":true},"reports":[{"instance_id":%q,"class":"self","outcome":"success"}]}]}`, in.ID)
	if r := peerPost(t, s, region, []byte(known), []byte(known), nil); r.Status != http.StatusOK {
		t.Fatalf("a body of known members: %d %s", r.Status, r.Body)
	}
	if n := unknown(); n != 1 {
		t.Errorf("muster_peer_unknown_fields_total = %v after a body of known members, want still 1", n)
	}
	if n := applied(); n != 2 {
		t.Fatalf("%v items applied, want 2", n)
	}

	// What cannot be understood is refused whole, unknown members or not.
	for _, tc := range []struct {
		name, body string
		status     int
		problem    string
	}{
		{"a known member of the wrong type", fmt.Sprintf(`{"batches":[{"actor":{"subject":"web","kind":"workload","service":"web"},"reports":[{"instance_id":%q,"class":"self","outcome":"success","age_ms":1},{"instance_id":%q,"class":7}]}]}`, in.ID, in.ID), http.StatusBadRequest, "malformed-json"},
		{"broken JSON after an unknown member", `{"new":1,"batches":[`, http.StatusBadRequest, "malformed-json"},
		{"an actor of a kind this release does not know", fmt.Sprintf(`{"batches":[{"actor":{"subject":"x","kind":"robot","new":true},"reports":[{"instance_id":%q,"class":"probe","outcome":"success"}]}]}`, in.ID), http.StatusUnprocessableEntity, "validation"},
		{"no batches, only unknown members", `{"batches":[],"new":[1,2]}`, http.StatusUnprocessableEntity, "validation"},
	} {
		r := peerPost(t, s, region, []byte(tc.body), []byte(tc.body), nil)
		if r.Status != tc.status {
			t.Fatalf("%s: %d %s, want %d", tc.name, r.Status, r.Body, tc.status)
		}
		if p := r.Problem(t); p.Type != server.ProblemBase+tc.problem {
			t.Errorf("%s: problem %+v, want %s", tc.name, p, tc.problem)
		}
	}
	if n := applied(); n != 2 {
		t.Fatalf("%v items applied after refused bodies, want still 2", n)
	}

	// The public API refuses the member the peer route ignores.
	body := fmt.Sprintf(`{"reports":[{"instance_id":%q,"class":"self","outcome":"success","age_ms":12}]}`, in.ID)
	r = s.DoWith(t, "POST", "/v1/reports", s.Token(t, webReq), "application/json", body, credentialHeader(in.Credential))
	if r.Status != http.StatusBadRequest {
		t.Fatalf("POST /v1/reports with an unknown member: %d %s, want 400", r.Status, r.Body)
	}
	if p := r.Problem(t); p.Type != server.ProblemBase+"unknown-field" {
		t.Errorf("POST /v1/reports with an unknown member: problem %+v", p)
	}
}

// TestARefusingPeerIsAlarmed: evidence a peer replica refuses (here every
// request, 422) is not dropped silently: it is counted in
// muster_evidence_forward_refused_total by peer and reason, and GET
// /v1/alarms lists evidence_forward_refused naming the peer.
func TestARefusingPeerIsAlarmed(t *testing.T) {
	t.Parallel()
	// a is never dealt a shard: z, the refusing replica, owns every
	// service, so a sends it what it takes.
	s := apptest.New(t, apptest.Options{Replica: "a", Hold: []string{app.WorkerOwnership},
		Ownership: func(c *ownership.Config) { c.Ready = func() bool { return false } }})
	s.Seed(t)
	in := registerOnHost(t, s, 9000)
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"type":"https://muster.dev/problems/validation","title":"Unprocessable Entity","status":422,"detail":"not this"}`)
	}))
	t.Cleanup(refusing.Close)
	// A live replica z at that address holding every shard, as its
	// heartbeat and leases would record it.
	s.MemberOwning(t, "z", refusing.URL)
	if err := s.App.Ownership.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	s.App.Forwarder.RunOnce(t.Context())

	body := fmt.Sprintf(`{"reports":[{"instance_id":%q,"class":"self","outcome":"success"}]}`, in.ID)
	if r := s.DoWith(t, "POST", "/v1/reports", s.Token(t, webReq), "application/json", body, credentialHeader(in.Credential)); r.Status != http.StatusOK {
		t.Fatalf("report: %d %s", r.Status, r.Body)
	}
	wait.For(t, 10*time.Second, "the refused item counted", func() bool {
		return labelled(t, s, "muster_evidence_forward_refused_total", "reason", forward.ReasonInvalid) == 1
	})
	r := s.Do(t, "GET", "/v1/alarms", s.Token(t, adminReq), "", "")
	if r.Status != http.StatusOK || !bytes.Contains(r.Body, []byte(`"kind":"`+forward.AlarmForwardRefused+`"`)) || !bytes.Contains(r.Body, []byte("replica z refused 1 ")) {
		t.Fatalf("GET /v1/alarms: %d %s, want %s naming z", r.Status, r.Body, forward.AlarmForwardRefused)
	}
}
