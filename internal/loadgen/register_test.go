package loadgen

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/registry"
)

// TestRegisterReadsBackBeforeRetrying: a registration muster answers with
// 503 (its database did not answer within the request's budget) may or
// may not have registered the instance. The load generator reads the
// service back before asking again, so it registers each addition once:
// it takes the instance the lost answer created, and registers again only
// when there is none. The server is a stand-in for muster's registration
// and list endpoints, because only a stand-in can commit a write and
// still answer 503 on cue.
func TestRegisterReadsBackBeforeRetrying(t *testing.T) {
	for _, tc := range []struct {
		name         string
		commitThe503 bool
	}{
		{"the 503 registered it", true},
		{"the 503 registered nothing", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var (
				mu    sync.Mutex
				posts int
				held  []registry.Instance
			)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				if r.URL.Path != "/v1/services/web/instances" {
					http.NotFound(w, r)
					return
				}
				switch r.Method {
				case http.MethodPost:
					posts++
					var reg registry.Registration
					b, _ := io.ReadAll(r.Body)
					if err := json.Unmarshal(b, &reg); err != nil {
						t.Errorf("registration body %s: %v", b, err)
					}
					in := registry.Instance{ID: uuid.New(), Service: "web", Address: reg.Address, Port: reg.Port, Zone: reg.Zone}
					if posts == 1 {
						if tc.commitThe503 {
							held = append(held, in)
						}
						w.Header().Set("Retry-After", "0")
						w.Header().Set("Content-Type", "application/problem+json")
						w.WriteHeader(http.StatusServiceUnavailable)
						_, _ = io.WriteString(w, `{"type":"https://muster.dev/problems/database-unavailable","status":503}`)
						return
					}
					held = append(held, in)
					w.WriteHeader(http.StatusCreated)
					_ = json.NewEncoder(w).Encode(in)
				case http.MethodGet:
					_ = json.NewEncoder(w).Encode(map[string]any{"items": held})
				}
			}))
			defer srv.Close()
			w := &lgWatch{lgwOptions: lgwOptions{base: srv.URL}, stderr: io.Discard, adminToken: "tok", api: srv.Client()}
			reg := registry.Registration{Address: "10.200.0.7", Port: 8080, Zone: "az1"}
			body, _ := json.Marshal(reg)
			got, err := w.register(context.Background(), "web", reg, body)
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(held) != 1 {
				t.Fatalf("%d instances registered, want 1: %+v", len(held), held)
			}
			if got.ID != held[0].ID {
				t.Errorf("took instance %s, but the one registered is %s", got.ID, held[0].ID)
			}
			if want := map[bool]int{true: 1, false: 2}[tc.commitThe503]; posts != want {
				t.Errorf("%d registrations sent, want %d", posts, want)
			}
		})
	}
}
