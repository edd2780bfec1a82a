package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/server"
)

// TestWatchRefusalsTouchNoDatabase (issue 14): refusing a watch is cheap.
// A subscription refused by admission, and one the caller may not make,
// run no query on PostgreSQL; an ordinary read does (so the count is not
// vacuous).
func TestWatchRefusalsTouchNoDatabase(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{Admission: stream.AdmissionConfig{Floor: 1, Window: time.Hour}})
	s.Seed(t)
	web, api := s.Token(t, apptest.Web), s.Token(t, apptest.API)
	if r := s.Do(t, "GET", "/v1/services/web", s.Token(t, adminReq), "", ""); r.Status != http.StatusOK {
		t.Fatalf("GET /v1/services/web: %d %s", r.Status, r.Body)
	}
	if n := s.RequestQueries("/v1/services/web"); n == 0 {
		t.Fatal("GET /v1/services/web ran no query: the counter counts nothing")
	}

	// api may not resolve web: refused before admission is spent.
	if r := s.Do(t, "GET", "/v1/watch?service=web", api, "", ""); r.Status != http.StatusForbidden {
		t.Fatalf("an unauthorised watch: %d %s", r.Status, r.Body)
	}
	if n := s.RequestQueries("/v1/watch"); n != 0 {
		t.Fatalf("an unauthorised watch ran %d queries, want 0", n)
	}

	// The one admission the window allows, then a refusal.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", s.URL+"/v1/watch?service=web", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+web)
	res, err := s.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("the first watch: %d", res.StatusCode)
	}
	r := s.Do(t, "GET", "/v1/watch?service=web", web, "", "")
	if r.Status != http.StatusServiceUnavailable || r.Problem(t).Type != wantAdmission || r.Header.Get("Retry-After") == "" {
		t.Fatalf("a watch past admission: %d %s", r.Status, r.Body)
	}
	if n := s.RequestQueries("/v1/watch"); n != 0 {
		t.Fatalf("watches ran %d queries, want 0", n)
	}
	// Admission comes before the token: a refusal costs no signature
	// check, and a caller without a valid token is refused alike.
	if r := s.Do(t, "GET", "/v1/watch?service=web", "not-a-token", "", ""); r.Status != http.StatusServiceUnavailable ||
		r.Problem(t).Type != wantAdmission {
		t.Fatalf("a watch past admission with a bad token: %d %s", r.Status, r.Body)
	}
}

var wantAdmission = server.ProblemBase + "admission"
