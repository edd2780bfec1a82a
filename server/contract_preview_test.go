package server_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/preview"
)

// TestContractPreview (issue 30): pay (self-reports only) runs three
// instances in az1. For a minute each reports ten times per 10 s window;
// from the third window two of them fail one report in ten. The platform
// defaults (removal at 50%) remove nobody on that evidence; a proposed
// hair-trigger contract (removal at 5%) previews both removed and az1's
// guard tripped (1 of 3 left, minimum 50%). The preview changes nothing:
// the live verdicts, the published view's version and the stored contract
// are as before, and the only new audit row is the attempt. A viewer of
// the owning team is refused 403 problem+json, audited; malformed JSON is
// 400 and an invalid contract 422, as PUT answers them.
func TestContractPreview(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	admin, oscar := s.Token(t, adminReq), s.Token(t, oscarReq)
	ids, _ := s.SelfReportedPay(t, oscar)

	type state struct {
		verdicts string
		removed  int
		version  uint64
		contract string
		seq      int64
	}
	snapshot := func() state {
		t.Helper()
		var st state
		r := s.Do(t, "GET", "/v1/services/pay/eligibility", admin, "", "")
		if r.Status != http.StatusOK {
			t.Fatalf("eligibility: %d %s", r.Status, r.Body)
		}
		el := apptest.Decode[evaluator.ServiceEligibility](t, r)
		el.GeneratedAt = time.Time{}
		for i := range el.Instances {
			for c, ev := range el.Instances[i].Evidence {
				ev.LastSampleAgeSeconds = nil // ages with the clock, not with the verdict
				el.Instances[i].Evidence[c] = ev
			}
		}
		st.verdicts, st.removed = fmt.Sprintf("%+v", el), el.Counts["ineligible"]
		v, ok := s.Hub.View("pay")
		if !ok {
			t.Fatal("no view of pay published")
		}
		st.version = v.Version
		r = s.Do(t, "GET", "/v1/services/pay/contract", admin, "", "")
		if r.Status != http.StatusOK {
			t.Fatalf("contract: %d %s", r.Status, r.Body)
		}
		st.contract = string(r.Body)
		st.seq = lastAuditSeq(t, s, admin)
		return st
	}
	before := snapshot()
	if before.removed != 0 {
		t.Fatalf("the defaults removed an instance live on 10%% failures: %s", before.verdicts)
	}

	hairTrigger := `{"removal_threshold":0.05,"reentry_threshold":0.01}`
	r := s.JSON(t, "POST", "/v1/services/pay/contract/preview", oscar, hairTrigger)
	if r.Status != http.StatusOK {
		t.Fatalf("preview: %d %s", r.Status, r.Body)
	}
	res := apptest.Decode[preview.Result](t, r)
	t.Logf("preview over %d windows from %s to %s: current removed %d, proposed removed %d (guard %+v)",
		res.Windows, res.From.Format(time.TimeOnly), res.To.Format(time.TimeOnly), res.Current.Removed, res.Proposed.Removed, res.Proposed.Guard)
	if res.Windows < 18 || res.Instances != 3 {
		t.Errorf("replayed %d windows of %d instances; want the 18 flushed of 3", res.Windows, res.Instances)
	}
	if res.Current.Removed != 0 || res.Proposed.Removed != 2 || res.Proposed.Removed <= res.Current.Removed {
		t.Errorf("removed: current %d, proposed %d; want 0 and 2", res.Current.Removed, res.Proposed.Removed)
	}
	if res.Proposed.FirstRemovalAt == nil || res.Current.Guard.Tripped || !res.Proposed.Guard.Tripped ||
		len(res.Proposed.Guard.Zones) != 1 || res.Proposed.Guard.Zones[0] != "az1" {
		t.Errorf("guard: current %+v, proposed %+v (first removal %v); want az1 tripped under the proposal only",
			res.Current.Guard, res.Proposed.Guard, res.Proposed.FirstRemovalAt)
	}
	if res.DiffsTotal != 2 || len(res.Differences) != 2 {
		t.Errorf("differences: %+v; want the two failing instances", res.Differences)
	}
	for _, d := range res.Differences {
		if d.InstanceID.String() != ids[0] && d.InstanceID.String() != ids[1] {
			t.Errorf("difference names %s, which never failed", d.InstanceID)
		}
	}

	// Nothing changed, even after another evaluation and publication.
	s.Evaluator.EvaluateNow()
	s.Publisher.RunOnce()
	after := snapshot()
	if after.verdicts != before.verdicts {
		t.Errorf("verdicts changed:\n%s\n%s", before.verdicts, after.verdicts)
	}
	if after.version != before.version {
		t.Errorf("view version %d -> %d", before.version, after.version)
	}
	if after.contract != before.contract {
		t.Errorf("stored contract changed:\n%s\n%s", before.contract, after.contract)
	}
	rows := auditSince(t, s, admin, before.seq)
	if len(rows) != 1 || rows[0].Action != "contract.preview" || rows[0].Outcome != audit.Accepted ||
		!strings.HasPrefix(rows[0].Actor, "operator:oscar") || rows[0].Target != "pay" {
		t.Fatalf("new audit rows %+v; want the one accepted contract.preview by oscar", rows)
	}
	if !bytes.Contains(rows[0].After, []byte(`"removal_threshold":0.05`)) {
		t.Errorf("the audit row does not record the proposal: %s", rows[0].After)
	}

	// A viewer may read the contract but not write it, so not preview it.
	seq := rows[0].Seq
	r = s.JSON(t, "POST", "/v1/services/pay/contract/preview", s.Token(t, veraReq), hairTrigger)
	if r.Status != http.StatusForbidden || r.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("viewer preview: %d %s %s", r.Status, r.Header.Get("Content-Type"), r.Body)
	}
	rows = auditSince(t, s, admin, seq)
	if len(rows) != 1 || rows[0].Action != "contract.preview" || rows[0].Outcome != audit.Refused || !strings.HasPrefix(rows[0].Actor, "operator:vera") {
		t.Fatalf("audit after the viewer's attempt: %+v; want one refused contract.preview by vera", rows)
	}
	seq = rows[0].Seq

	// Malformed JSON is 400 and an invalid contract 422, as for PUT.
	r = s.JSON(t, "POST", "/v1/services/pay/contract/preview", oscar, `{"removal_threshold":`)
	if r.Status != http.StatusBadRequest || r.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("malformed JSON: %d %s %s", r.Status, r.Header.Get("Content-Type"), r.Body)
	}
	r = s.JSON(t, "POST", "/v1/services/pay/contract/preview", oscar, `{"removal_threshold":1}`)
	if r.Status != http.StatusUnprocessableEntity || r.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("invalid contract: %d %s %s", r.Status, r.Header.Get("Content-Type"), r.Body)
	}
	rows = auditSince(t, s, admin, seq)
	if len(rows) != 1 || rows[0].Outcome != audit.Refused || rows[0].Action != "contract.preview" {
		t.Errorf("audit after the malformed and invalid attempts: %+v; want one refused contract.preview (the invalid one; malformed JSON never reaches the registry, as for PUT)", rows)
	}
	if final := snapshot(); final.contract != before.contract || final.version != before.version {
		t.Errorf("a refused preview changed the contract or the view")
	}
}

// lastAuditSeq is the newest audit row's sequence number.
func lastAuditSeq(t *testing.T, s *stack, token string) int64 {
	t.Helper()
	r := s.Do(t, "GET", "/v1/audit?limit=1", token, "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("audit: %d %s", r.Status, r.Body)
	}
	page := apptest.Decode[struct{ Items []audit.Event }](t, r)
	if len(page.Items) == 0 {
		return 0
	}
	return page.Items[0].Seq
}

// auditSince lists the audit rows after seq, oldest first.
func auditSince(t *testing.T, s *stack, token string, seq int64) []audit.Event {
	t.Helper()
	r := s.Do(t, "GET", "/v1/audit?limit=1000", token, "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("audit: %d %s", r.Status, r.Body)
	}
	var out []audit.Event
	for _, e := range apptest.Decode[struct{ Items []audit.Event }](t, r).Items {
		if e.Seq > seq {
			out = append([]audit.Event{e}, out...)
		}
	}
	return out
}
