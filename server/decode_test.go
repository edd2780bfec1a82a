package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/musterhq/muster/internal/registry"
)

// FuzzDecodeJSON feeds arbitrary bodies to the decoder every write endpoint
// uses. It must never panic, and must either decode cleanly or answer one of
// the documented client-error problems.
func FuzzDecodeJSON(f *testing.F) {
	for _, seed := range []string{
		`{"address":"127.0.0.1","port":9000,"zone":"az1"}`,
		`{"dependencies":[{"name":"db","shared":true,"authority":"unready"}]}`,
		`{"weights":{"probe":1e309}}`, `{"port":-1}`, `{"port":1.5}`, `[]`, `null`, `{`, `{}{}`,
		`{"address":"\ud800"}`, "\xff\xfe", `{"owner":"x","capabilities":null}`, strings.Repeat(`[`, 10000),
	} {
		f.Add(seed, "application/json")
	}
	f.Add(`{}`, "text/plain")
	f.Add(`{}`, "application/json; charset=latin1")
	s := &Server{cfg: Config{MaxBodyBytes: 4096}}
	f.Fuzz(func(t *testing.T, body, ctype string) {
		for _, target := range []func() any{
			func() any { return &registry.Registration{} },
			func() any { c := registry.DefaultContract(); return &c },
			func() any { return &registry.ServiceSpec{} },
		} {
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
			r.Header.Set("Content-Type", ctype)
			w := httptest.NewRecorder()
			v := target()
			p := s.decodeJSON(w, r, v)
			if p == nil {
				// What decoded must be a JSON object that re-encodes.
				if _, err := json.Marshal(v); err != nil {
					t.Fatalf("decoded value does not re-encode: %v", err)
				}
				continue
			}
			switch p.Status {
			case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
			default:
				t.Fatalf("status %d for body %q", p.Status, body)
			}
			if !strings.HasPrefix(p.Type, ProblemBase) || p.Detail == "" {
				t.Fatalf("problem %+v", p)
			}
		}
	})
}
