package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/peer"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/server"
)

// TestPeerAuthz (issue 27): GET /v1/peer/authz hands a replica signed
// with the region's key the rows of services and grants, seals included;
// an unsigned request is refused 401.
func TestPeerAuthz(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	get := func(signed bool) (int, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, s.URL+server.PeerAuthzPath, nil)
		if err != nil {
			t.Fatal(err)
		}
		if signed {
			if err := (peer.Signer{ID: "peer-b", Key: apptest.SealKey()}).Sign(t.Context(), req, s.URL, nil); err != nil {
				t.Fatal(err)
			}
		}
		res, err := s.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, b
	}
	if code, b := get(false); code != http.StatusUnauthorized {
		t.Fatalf("unsigned: %d %s", code, b)
	}
	var body struct {
		Services []struct {
			Name string `json:"name"`
			Seal []byte `json:"seal"`
		} `json:"services"`
		Grants []json.RawMessage `json:"grants"`
	}
	wait.For(t, 30*time.Second, "the rows of services and grants from a signed request", func() bool {
		code, b := get(true)
		if code != http.StatusOK {
			return false
		}
		if err := json.Unmarshal(b, &body); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		return len(body.Services) > 0
	})
	for _, svc := range body.Services {
		if svc.Name == "" || len(svc.Seal) == 0 {
			t.Errorf("a service row without its name or seal: %+v", svc)
		}
	}
}
