package demo

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/devissuer"
)

// shiftAPI is a scripted stand-in for muster's shift API, to drive the
// demo's failover through answers a loaded server gives: it is the
// demo's client logic under test, not muster.
type shiftAPI struct {
	mu     sync.Mutex
	posts  int
	gets   int
	shifts []map[string]string
	// answerPost decides the n-th POST's status (1-based) and whether it
	// made the shift before answering.
	answerPost func(n int) (status int, made bool)
}

func (a *shiftAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/shifts":
		a.posts++
		status, made := a.answerPost(a.posts)
		s := map[string]string{"id": "shift-" + string(rune('0'+a.posts)), "target": "az3", "state": "draining"}
		if made {
			a.shifts = append(a.shifts, s)
		}
		if status != http.StatusCreated {
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"status":503}`, status)
			return
		}
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(s)
	case r.Method == http.MethodGet && r.URL.Path == "/v1/shifts":
		a.gets++
		_ = json.NewEncoder(w).Encode(map[string]any{"items": a.shifts})
	default:
		http.Error(w, "not scripted", http.StatusTeapot)
	}
}

func newDemo(t *testing.T, api http.Handler) *Demo {
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return &Demo{
		cfg:    Config{URL: srv.URL, Mint: func(devissuer.TokenRequest) (string, error) { return "tok", nil }, HTTPClient: srv.Client()},
		log:    slog.New(slog.DiscardHandler),
		tokens: map[string]string{},
	}
}

// A drain that a busy server answers 503 is tried again: the failover
// story must not end on the first refusal of a loaded machine (the
// shiftback_pending alarm never came, and the browser test waited for it
// in vain).
func TestFailoverRetriesATransientRefusal(t *testing.T) {
	api := &shiftAPI{answerPost: func(n int) (int, bool) {
		if n == 1 {
			return http.StatusServiceUnavailable, false
		}
		return http.StatusCreated, true
	}}
	d := newDemo(t, api)
	var f failover
	ctx := context.Background()
	f.advance(ctx, d, 11*time.Second)
	if f.done || f.id != "" {
		t.Fatalf("after a 503: done=%v id=%q, want it to try again", f.done, f.id)
	}
	if f.nextStep.Before(time.Now()) {
		t.Fatalf("next attempt at %v: want it after the Retry-After", f.nextStep)
	}
	f.nextStep = time.Time{} // the Retry-After has passed
	f.advance(ctx, d, 13*time.Second)
	if f.id != "shift-2" || api.posts != 2 || api.gets != 1 {
		t.Fatalf("id=%q posts=%d gets=%d, want the second drain's shift after one read-back", f.id, api.posts, api.gets)
	}
}

// A drain whose answer was lost may have been made: the demo reads back
// and adopts that shift instead of draining az3 a second time.
func TestFailoverAdoptsADrainWhoseAnswerWasLost(t *testing.T) {
	api := &shiftAPI{answerPost: func(n int) (int, bool) { return http.StatusServiceUnavailable, true }}
	d := newDemo(t, api)
	var f failover
	ctx := context.Background()
	f.advance(ctx, d, 11*time.Second)
	f.nextStep = time.Time{}
	f.advance(ctx, d, 13*time.Second)
	if f.id != "shift-1" || api.posts != 1 {
		t.Fatalf("id=%q posts=%d, want the first drain's shift adopted with no second drain", f.id, api.posts)
	}
}

// A refusal that is not transient (say 403) ends the story: retrying
// would not change the answer.
func TestFailoverEndsOnAFirmRefusal(t *testing.T) {
	api := &shiftAPI{answerPost: func(int) (int, bool) { return http.StatusForbidden, false }}
	d := newDemo(t, api)
	var f failover
	f.advance(context.Background(), d, 11*time.Second)
	if !f.done || api.posts != 1 {
		t.Fatalf("done=%v posts=%d, want the story ended after one refused drain", f.done, api.posts)
	}
}

// A lease renewal a busy server refuses is tried again at once, up to
// three attempts in all; a firm refusal is not.
func TestRenewalRetriesTransientRefusals(t *testing.T) {
	for _, tc := range []struct {
		name         string
		refusals     int // answered 503 before a 200
		status       int // the refusal's status
		wantAttempts int
		wantErr      bool
	}{
		{"one 503", 1, http.StatusServiceUnavailable, 2, false},
		{"two 503s", 2, http.StatusServiceUnavailable, 3, false},
		{"three 503s", 3, http.StatusServiceUnavailable, 3, true},
		{"a 404", 1, http.StatusNotFound, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			attempts := 0
			d := newDemo(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				attempts++
				if r.Method != http.MethodPut || r.URL.Path != "/v1/instances/i1/lease" || r.Header.Get("Muster-Instance-Credential") != "c1" {
					http.Error(w, "not scripted", http.StatusTeapot)
					return
				}
				if attempts <= tc.refusals {
					http.Error(w, "{}", tc.status)
					return
				}
				w.WriteHeader(http.StatusNoContent)
			}))
			err := d.renewOne(context.Background(), instance{id: "i1", credential: "c1"}, "tok")
			mu.Lock()
			defer mu.Unlock()
			if (err != nil) != tc.wantErr || attempts != tc.wantAttempts {
				t.Fatalf("err=%v attempts=%d, want error %v after %d", err, attempts, tc.wantErr, tc.wantAttempts)
			}
		})
	}
}

// A lease that ran out (its renewals lost to a machine too busy to
// answer) is not the end of the instance's story: the renewal pass
// registers it again at the same address, renews the new id with the
// new credential from then on, and assigns the new id to its zone's
// prober (the flapping instance's quarantine story stopped for good when
// it did not).
func TestRenewalRegistersAnEndedInstanceAgain(t *testing.T) {
	var mu sync.Mutex
	var assigned []string
	renewed := map[string]int{}
	d := newDemo(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case r.Method == http.MethodPut && r.URL.Path == "/v1/instances/i1/lease":
			http.Error(w, `{"status":410}`, http.StatusGone)
		case r.Method == http.MethodPost && r.URL.Path == "/v1/services/catalog/instances":
			var body map[string]any
			if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body["address"] != "10.1.6.10" || body["zone"] != "az1" {
				http.Error(w, "not the same place in the estate", http.StatusTeapot)
				return
			}
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(map[string]string{"id": "i2", "credential": "c2"})
		case r.Method == http.MethodPut && r.URL.Path == "/v1/probers/prober-az1/assignments":
			var body struct{ Instances []string }
			_ = json.NewDecoder(r.Body).Decode(&body)
			assigned = body.Instances
			w.WriteHeader(http.StatusOK)
		case r.Method == http.MethodPut && r.URL.Path == "/v1/instances/i2/lease" && r.Header.Get("Muster-Instance-Credential") == "c2":
			renewed["i2"]++
			w.WriteHeader(http.StatusNoContent)
		default:
			http.Error(w, "not scripted", http.StatusTeapot)
		}
	}))
	d.instances = []instance{{id: "i1", service: "catalog", zone: "az1", addr: "10.1.6.10", credential: "c1"}}
	d.renew(context.Background())
	d.renew(context.Background())
	mu.Lock()
	defer mu.Unlock()
	if got := d.all(); len(got) != 1 || got[0].id != "i2" || got[0].credential != "c2" {
		t.Fatalf("instances after the lease ended: %+v, want i2 with c2 in i1's place", got)
	}
	if len(assigned) != 1 || assigned[0] != "i2" {
		t.Fatalf("prober-az1 assigned %v, want [i2]", assigned)
	}
	if renewed["i2"] != 1 {
		t.Fatalf("i2 renewed %d times, want once (the second pass)", renewed["i2"])
	}
}
