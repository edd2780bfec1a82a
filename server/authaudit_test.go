package server_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/musterhq/muster/internal/audit"
)

// TestAuthFailuresAreSummarisedPerSourcePerMinute (issue 25): requests
// refused for a forged (bad signature), expired, unknown issuer's or
// malformed token are on the audit record as one refused auth.refuse row
// per source address per minute, with the counts by reason, and never
// the token; a request with no token at all is answered and counted
// only. The next minute's failures are the next row.
func TestAuthFailuresAreSummarisedPerSourcePerMinute(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStack(t)
	admin := s.Token(t, adminReq)

	expired, err := s.Issuer.Mint(oscarReq, time.Now().Add(-3*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	// Forged: a real token's claims with the signature changed.
	valid := s.Token(t, oscarReq)
	dot := strings.LastIndexByte(valid, '.')
	sig, err := base64.RawURLEncoding.DecodeString(valid[dot+1:])
	if err != nil {
		t.Fatal(err)
	}
	sig[0] ^= 0xff
	forged := valid[:dot+1] + base64.RawURLEncoding.EncodeToString(sig)
	// A well-formed token from an issuer muster does not trust.
	enc := base64.RawURLEncoding.EncodeToString
	stranger := enc([]byte(`{"alg":"RS256","kid":"k1"}`)) + "." + enc([]byte(`{"iss":"https://issuer.example","sub":"mallory","aud":"muster","exp":4102444800}`)) + "." + enc([]byte("not a signature"))
	malformed := "definitely-not-a-jwt"

	tokens := []string{forged, forged, expired, stranger, malformed}
	for _, tok := range tokens {
		if r := s.Do(t, "GET", "/v1/services", tok, "", ""); r.Status != http.StatusUnauthorized {
			t.Fatalf("GET /v1/services with a bad token: %d %s", r.Status, r.Body)
		}
	}
	if r := s.Do(t, "GET", "/v1/services", "", "", ""); r.Status != http.StatusUnauthorized {
		t.Fatalf("GET /v1/services without a token: %d %s", r.Status, r.Body)
	}
	s.AuthFailures.RunOnce(ctx, false)

	rows := func() []audit.Event {
		t.Helper()
		r := s.Do(t, "GET", "/v1/audit?outcome=refused&action=auth.refuse&limit=50", admin, "", "")
		var page struct{ Items []audit.Event }
		if err := json.Unmarshal(r.Body, &page); r.Status != http.StatusOK || err != nil {
			t.Fatalf("audit: %d %s", r.Status, r.Body)
		}
		return page.Items
	}
	type after struct {
		Total    int            `json:"refused_total"`
		ByReason map[string]int `json:"by_reason"`
	}
	got := rows()
	if len(got) != 1 {
		t.Fatalf("%d auth.refuse rows, want 1: %+v", len(got), got)
	}
	e := got[0]
	if e.Actor != "source:127.0.0.1" || e.Target != "127.0.0.1" || e.TargetKind != "source" || e.Outcome != audit.Refused {
		t.Errorf("row %+v", e)
	}
	var a after
	if err := json.Unmarshal(e.After, &a); err != nil {
		t.Fatal(err)
	}
	want := after{Total: 5, ByReason: map[string]int{"bad_signature": 2, "expired": 1, "unknown_issuer": 1, "malformed": 1}}
	if diff := cmp.Diff(want, a); diff != "" {
		t.Errorf("summary (-want +got):\n%s", diff)
	}
	raw, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range tokens {
		if part := tok[strings.LastIndexByte(tok, '.')+1:]; strings.Contains(string(raw), part) {
			t.Fatalf("the row carries a token: %s", raw)
		}
	}

	// Within the minute: pending, no second row; a minute on, one more.
	for range 3 {
		s.Do(t, "GET", "/v1/services", expired, "", "")
	}
	s.AuthFailures.RunOnce(ctx, false)
	if n := len(rows()); n != 1 {
		t.Fatalf("%d rows within the minute, want 1", n)
	}
	s.Clock.Advance(time.Minute)
	s.AuthFailures.RunOnce(ctx, false)
	got = rows()
	if len(got) != 2 {
		t.Fatalf("%d rows a minute on, want 2", len(got))
	}
	a = after{}
	if err := json.Unmarshal(got[0].After, &a); err != nil || a.Total != 3 || a.ByReason["expired"] != 3 {
		t.Fatalf("the second minute's row: %s (%v)", got[0].After, err)
	}
	verifyAudit(t, s)
}
