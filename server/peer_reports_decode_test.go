package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/forward"
)

// FuzzPeerReports feeds arbitrary bodies to the decoder of POST
// /v1/peer/reports: it must never panic, and must either decode to
// batches that are all applicable (1 to MaxBatch reports in all, none
// empty, every actor a principal) or refuse the body whole with one of
// the documented client-error problems.
func FuzzPeerReports(f *testing.F) {
	id := "0195d0a1-0000-7000-8000-000000000001"
	item := `{"instance_id":"` + id + `","class":"self","outcome":"success","at":"2026-12-03T09:00:00Z"}`
	for _, seed := range []string{
		`{"batches":[{"actor":{"subject":"web","kind":"workload","service":"web"},"reports":[` + item + `]}]}`,
		`{"batches":[{"actor":{"subject":"p","kind":"prober","issuer":"https://x","home":true},"reports":[` + item + `,` + item + `]},{"actor":{"subject":"o","kind":"operator","role":"admin"},"reports":[` + item + `]}]}`,
		`{"batches":[{"actor":{"subject":"web","kind":"workload"},"reports":[` + item + `]}]}`,
		`{"batches":[{"actor":{"subject":"","kind":"prober"},"reports":[` + item + `]}]}`,
		`{"batches":[{"actor":{"subject":"x","kind":"robot"},"reports":[` + item + `]}]}`,
		`{"batches":[{"actor":{"subject":"x","kind":"tool","role":"god"},"reports":[` + item + `]}]}`,
		`{"batches":[{"actor":{"subject":"x","kind":"prober"},"reports":[]}]}`,
		`{"batches":[]}`, `{"batches":null}`, `{"batches":[{"actor":{"subject":"x","kind":"prober","token":"t"},"reports":[]}]}`,
		`{"batches":[{"actor":{"subject":"x","kind":"prober"},"reports":[{"instance_id":"x"}]}]}`,
		`[]`, `null`, `{`, `{}{}`, "\xff\xfe", strings.Repeat(`[`, 10000), `{"reports":[` + item + `]}`,
	} {
		f.Add(seed, "application/json")
	}
	f.Add(`{}`, "text/plain")
	at := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	compact, err := forward.EncodeBinary(forward.Body{Batches: []forward.Batch{
		{Actor: forward.Actor{Subject: "web", Kind: "workload", Service: "web"}, Reports: []evaluator.Report{{InstanceID: uuid.MustParse(id), Class: "self", Outcome: "success", At: &at}}},
		{Actor: forward.Actor{Subject: "x", Kind: "robot"}, Reports: []evaluator.Report{{InstanceID: uuid.MustParse(id), Class: "probe", Outcome: "hard_failure"}}},
	}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(compact), forward.BinaryContentType)
	f.Add(string(compact[:len(compact)-3]), forward.BinaryContentType)
	f.Add("MEV1\x01\x00\x00", forward.BinaryContentType)
	f.Fuzz(func(t *testing.T, body, ctype string) {
		r := httptest.NewRequest(http.MethodPost, "/v1/peer/reports", strings.NewReader(body))
		r.Header.Set("Content-Type", ctype)
		batches, _, p := decodePeerReports(httptest.NewRecorder(), r)
		if p == nil {
			total := 0
			for _, b := range batches {
				if len(b.reports) == 0 || b.actor.Kind == "" || b.actor.Subject == "" {
					t.Fatalf("decoded an empty batch or no actor from %q: %+v", body, b)
				}
				total += len(b.reports)
			}
			if total == 0 || total > evaluator.MaxBatch {
				t.Fatalf("decoded %d reports from %q", total, body)
			}
			return
		}
		if batches != nil {
			t.Fatalf("a refused body still gave batches: %q", body)
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
