package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// FuzzDecodeReports feeds arbitrary bodies to the report batch decoder: it
// must never panic, and must either decode cleanly (to a batch that
// re-encodes) or answer one of the documented client-error problems.
func FuzzDecodeReports(f *testing.F) {
	for _, seed := range []string{
		`{"reports":[{"instance_id":"0195d0a1-0000-7000-8000-000000000001","class":"probe","outcome":"success"}]}`,
		`{"reports":[{"instance_id":"x"}]}`, `{"reports":[{"instance_id":"0195d0a1-0000-7000-8000-000000000001","successes":4294967296}]}`,
		`{"reports":[{"at":"yesterday"}]}`, `{"reports":null}`, `{"Reports":[]}`, `{"reports":[],"reports":[]}`,
		`{"reports":[{"instance_id":"0195d0a1-0000-7000-8000-000000000001","class":"self","dependency":"\ud800"}]}`,
		`[]`, `null`, `{`, `{}{}`, "\xff\xfe", strings.Repeat(`[`, 10000), `{"reports":[{"extra":1}]}`,
	} {
		f.Add(seed, "application/json")
	}
	f.Add(`{}`, "text/plain")
	s := &Server{cfg: Config{MaxBodyBytes: 4096}}
	f.Fuzz(func(t *testing.T, body, ctype string) {
		r := httptest.NewRequest(http.MethodPost, "/v1/reports", strings.NewReader(body))
		r.Header.Set("Content-Type", ctype)
		var b reportBatch
		p := s.decodeReports(httptest.NewRecorder(), r, &b)
		if p == nil {
			if _, err := json.Marshal(b); err != nil {
				t.Fatalf("decoded batch does not re-encode: %v", err)
			}
			return
		}
		switch p.Status {
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
		default:
			t.Fatalf("status %d for body %q", p.Status, body)
		}
		if !strings.HasPrefix(p.Type, ProblemBase) || p.Detail == "" {
			t.Fatalf("problem %+v", p)
		}
	})
}

// The refusals decodeJSON gives, the report decoder gives too.
func TestDecodeReportsRefusals(t *testing.T) {
	s := &Server{cfg: Config{MaxBodyBytes: 256}}
	for _, tc := range []struct {
		body, ctype string
		status      int
		typ         string
	}{
		{`{"reports":[]}`, "text/plain", 415, "unsupported-media-type"},
		{`{"reports":[` + strings.Repeat(`{},`, 100) + `{}]}`, "application/json", 413, "body-too-large"},
		{`{"reports":[`, "application/json", 400, "malformed-json"},
		{``, "application/json", 400, "malformed-json"},
		{`{"reports":[]} {}`, "application/json", 400, "malformed-json"},
		{`{"reports":[{"instance_id":"x"}]}`, "application/json", 400, "malformed-json"},
		{`{"reports":[{"gossip":1}]}`, "application/json", 400, "unknown-field"},
		{`{"reports":[],"reports":[]}`, "application/json", 400, "malformed-json"},
	} {
		r := httptest.NewRequest(http.MethodPost, "/v1/reports", strings.NewReader(tc.body))
		r.Header.Set("Content-Type", tc.ctype)
		var b reportBatch
		p := s.decodeReports(httptest.NewRecorder(), r, &b)
		if p == nil || p.Status != tc.status || p.Type != ProblemBase+tc.typ {
			t.Errorf("%q (%s): %+v, want %d %s", tc.body, tc.ctype, p, tc.status, tc.typ)
		}
	}
}

// BenchmarkDecodeReports: a 1,000-item probe batch through the report
// decoder, and through decodeJSON (encoding/json v1) for comparison.
func BenchmarkDecodeReports(b *testing.B) {
	var items []string
	for range 1000 {
		items = append(items, fmt.Sprintf(`{"instance_id":%q,"class":"probe","outcome":"success"}`, uuid.New()))
	}
	body := `{"reports":[` + strings.Join(items, ",") + `]}`
	s := &Server{cfg: Config{MaxBodyBytes: 64 << 20}}
	for _, c := range []struct {
		name string
		dec  func(w http.ResponseWriter, r *http.Request, v *reportBatch) *Problem
	}{
		{"v2", s.decodeReports},
		{"v1", func(w http.ResponseWriter, r *http.Request, v *reportBatch) *Problem { return s.decodeJSON(w, r, v) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, "/v1/reports", strings.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				var batch reportBatch
				if p := c.dec(httptest.NewRecorder(), r, &batch); p != nil {
					b.Fatal(p)
				}
			}
		})
	}
}
