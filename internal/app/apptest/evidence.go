package apptest

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
)

// SelfReportedPay creates pay (the payments team's, self-reports only)
// with three instances in az1, registered with registrar's token, and a
// minute of evidence: each instance reports ten times per 10 s window,
// and from the third window the first two fail one report in ten. Each
// window is evaluated and flushed to PostgreSQL as the evaluator's ticker
// would, and the views published past the addition window. The platform
// defaults (removal at 50%) remove nobody on it; a 5% removal threshold
// removes both (the contract preview's tests). It returns the
// instances' ids and report, which sends one more window of successes.
func (s *Stack) SelfReportedPay(t testing.TB, registrar string) (ids []string, report func()) {
	t.Helper()
	if r := s.JSON(t, "PUT", "/v1/services/pay", s.Token(t, Admin), `{"owner":"payments","capabilities":["self"]}`); r.Status != http.StatusCreated {
		t.Fatalf("create pay: %d %s", r.Status, r.Body)
	}
	var addrs []string
	for i := range 3 {
		addr := fmt.Sprintf("10.0.7.%d", i+1)
		r := s.JSON(t, "POST", "/v1/services/pay/instances", registrar, fmt.Sprintf(`{"address":%q,"port":8080,"zone":"az1"}`, addr))
		if r.Status != http.StatusCreated {
			t.Fatalf("register: %d %s", r.Status, r.Body)
		}
		ids = append(ids, Decode[registry.Instance](t, r).ID.String())
		addrs = append(addrs, addr)
	}
	s.WaitReady(t)
	s.SyncNow(t)
	pay := s.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "pay", Addresses: addrs})
	send := func(window int) {
		t.Helper()
		var items []string
		for i, id := range ids {
			for k := range 10 {
				outcome := "success"
				if i < 2 && window >= 2 && k == 0 {
					outcome = "failure"
				}
				items = append(items, fmt.Sprintf(`{"instance_id":%q,"class":"self","outcome":%q}`, id, outcome))
			}
		}
		r := s.JSON(t, "POST", "/v1/reports", pay, `{"reports":[`+strings.Join(items, ",")+`]}`)
		if r.Status != http.StatusOK || Decode[evaluator.Result](t, r).Accepted != len(items) {
			t.Fatalf("window %d: POST /v1/reports: %d %s", window, r.Status, r.Body)
		}
	}
	for window := range 6 {
		send(window)
		s.Evaluator.EvaluateNow()
		if err := s.Evaluator.FlushNow(t.Context()); err != nil {
			t.Fatal(err)
		}
		s.Clock.Advance(10 * time.Second)
	}
	s.Evaluator.EvaluateNow()
	s.Publisher.RunOnce()
	s.Clock.Advance(assembler.DefaultAdditionWindow + 100*time.Millisecond)
	s.Publisher.RunOnce()
	return ids, func() { send(0) }
}
