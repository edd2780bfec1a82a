package server

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/registry"
)

// renewalBody is a POST /v1/leases/renewals body naming ids.
func renewalBody(ids ...string) string {
	items := make([]string, len(ids))
	for i, id := range ids {
		items[i] = `{"instance_id":"` + id + `"}`
	}
	return `{"renewals":[` + strings.Join(items, ",") + `]}`
}

// FuzzDecodeRenewals feeds arbitrary bodies to the renewal batch
// decoder: it must never panic, and must either decode to a batch the
// registry may renew (1 to MaxRenewalBatch distinct instances) or answer
// one of the documented client-error problems.
func FuzzDecodeRenewals(f *testing.F) {
	id := "0195d0a1-0000-7000-8000-000000000001"
	for _, seed := range []string{
		renewalBody(id), renewalBody(id, id), renewalBody("x"), renewalBody(),
		`{"renewals":[{"instance_id":"` + id + `","credential":"c2VjcmV0"}]}`,
		`{"renewals":[{"instance_id":"` + id + `","credential":7}]}`,
		`{"renewals":null}`, `{"Renewals":[]}`, `{"renewals":[{"id":"` + id + `"}]}`,
		`{"renewals":[{"instance_id":"{` + id + `}"}]}`, `{"renewals":[{"instance_id":"urn:uuid:` + id + `"}]}`,
		`[]`, `null`, `{`, `{}{}`, "\xff\xfe", strings.Repeat(`[`, 10000),
	} {
		f.Add(seed, "application/json")
	}
	f.Add(`{}`, "text/plain")
	s := &Server{cfg: Config{MaxBodyBytes: 4096}}
	f.Fuzz(func(t *testing.T, body, ctype string) {
		r := httptest.NewRequest(http.MethodPost, "/v1/leases/renewals", strings.NewReader(body))
		r.Header.Set("Content-Type", ctype)
		out, p := s.decodeRenewals(httptest.NewRecorder(), r)
		if p == nil {
			if len(out) == 0 || len(out) > registry.MaxRenewalBatch {
				t.Fatalf("decoded %d renewals from %q", len(out), body)
			}
			seen := map[uuid.UUID]bool{}
			for _, rn := range out {
				if seen[rn.ID] {
					t.Fatalf("decoded instance %s twice from %q", rn.ID, body)
				}
				seen[rn.ID] = true
			}
			return
		}
		if out != nil {
			t.Fatalf("a refused body decoded to %v", out)
		}
		switch p.Status {
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity:
		default:
			t.Fatalf("status %d for body %q", p.Status, body)
		}
		if !strings.HasPrefix(p.Type, ProblemBase) || p.Detail == "" {
			t.Fatalf("problem %+v", p)
		}
	})
}

// TestDecodeRenewalsRefusals: each way a batch can be malformed is
// refused with its problem, naming the field where there is one.
func TestDecodeRenewalsRefusals(t *testing.T) {
	s := &Server{cfg: Config{MaxBodyBytes: 1 << 20}}
	a, b := uuid.NewString(), uuid.NewString()
	many := make([]string, registry.MaxRenewalBatch+1)
	for i := range many {
		many[i] = uuid.NewString()
	}
	for _, tc := range []struct {
		name, body, ctype string
		status            int
		typ, field        string
	}{
		{"text", renewalBody(a), "text/plain", 415, "unsupported-media-type", ""},
		{"too large", renewalBody(many...) + strings.Repeat(" ", 1<<20), "application/json", 413, "body-too-large", ""},
		{"not JSON", `{"renewals":[`, "application/json", 400, "malformed-json", ""},
		{"empty body", ``, "application/json", 400, "malformed-json", ""},
		{"trailing data", renewalBody(a) + ` {}`, "application/json", 400, "malformed-json", ""},
		{"wrong type", `{"renewals":{"instance_id":"` + a + `"}}`, "application/json", 400, "malformed-json", "renewals"},
		{"unknown field", `{"renewals":[{"instance_id":"` + a + `","ttl":60}]}`, "application/json", 400, "unknown-field", "ttl"},
		{"no renewals", renewalBody(), "application/json", 422, "validation", "renewals"},
		{"null renewals", `{"renewals":null}`, "application/json", 422, "validation", "renewals"},
		{"too many", renewalBody(many...), "application/json", 422, "validation", "renewals"},
		{"not an id", renewalBody(a, "web-1"), "application/json", 422, "validation", "renewals[1].instance_id"},
		{"twice", renewalBody(a, b, a), "application/json", 422, "validation", "renewals[2].instance_id"},
	} {
		r := httptest.NewRequest(http.MethodPost, "/v1/leases/renewals", strings.NewReader(tc.body))
		r.Header.Set("Content-Type", tc.ctype)
		out, p := s.decodeRenewals(httptest.NewRecorder(), r)
		if p == nil || p.Status != tc.status || p.Type != ProblemBase+tc.typ || out != nil {
			t.Errorf("%s: %+v (%d decoded), want %d %s", tc.name, p, len(out), tc.status, tc.typ)
			continue
		}
		if tc.field != "" && (len(p.Errors) == 0 || p.Errors[0].Field != tc.field) {
			t.Errorf("%s: errors %+v, want the first naming %s", tc.name, p.Errors, tc.field)
		}
	}
	// A batch of the most leases, each with its credential, decodes.
	items := make([]string, registry.MaxRenewalBatch)
	for i := range items {
		items[i] = fmt.Sprintf(`{"instance_id":%q,"credential":"secret-%d"}`, many[i], i)
	}
	r := httptest.NewRequest(http.MethodPost, "/v1/leases/renewals", strings.NewReader(`{"renewals":[`+strings.Join(items, ",")+`]}`))
	r.Header.Set("Content-Type", "application/json")
	out, p := s.decodeRenewals(httptest.NewRecorder(), r)
	if p != nil || len(out) != registry.MaxRenewalBatch || out[7].ID.String() != many[7] || !out[7].Credential.Present() {
		t.Fatalf("a full batch: %+v, %d decoded", p, len(out))
	}
}
