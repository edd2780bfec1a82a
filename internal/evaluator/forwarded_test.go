package evaluator_test

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/google/uuid"

	st "github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
)

// TestIngestForwarded (issue 27): evidence another replica accepted skips
// only the proofs that replica made (the source address and the instance
// credential of a self-report); the rest is checked again here, and what
// is applied is counted as forwarded, not in the local accepted and
// refused counts, and in the observed windows (only the owner writes them:
// the region's evidence, once).
func TestIngestForwarded(t *testing.T) {
	t.Parallel()
	f := newFixture(t, st.Options{})
	web := identity.Principal{Kind: identity.KindWorkload, Service: "web", Subject: "web"}
	prober2 := identity.Principal{Kind: identity.KindProber, Subject: "prober-az2"}
	id := func(s string) uuid.UUID { return uuid.MustParse(s) }

	// web's self-report about web[0], with no source address in the
	// context: refused on Ingest, accepted forwarded.
	items := []evaluator.Report{{InstanceID: id(f.web[0]), Class: "self", Outcome: "success"}}
	if res, err := f.Evaluator.Ingest(t.Context(), web, items); err != nil || res.Accepted != 0 || res.Refused[0].Code != "not_own_instance" {
		t.Fatalf("Ingest without proof: %+v %v", res, err)
	}
	if res, err := f.Evaluator.IngestForwarded(t.Context(), web, items); err != nil || res.Accepted != 1 || len(res.Refused) != 0 {
		t.Fatalf("IngestForwarded: %+v %v", res, err)
	}

	// Everything else is checked: another service's instance, a bad
	// outcome, an unknown instance, an unassigned prober.
	res, err := f.Evaluator.IngestForwarded(t.Context(), web, []evaluator.Report{
		{InstanceID: id(f.api[0]), Class: "self", Outcome: "success"},
		{InstanceID: id(f.web[0]), Class: "self", Outcome: "meh"},
		{InstanceID: uuid.Must(uuid.NewV7()), Class: "passive", Outcome: "success"},
	})
	if err != nil || res.Accepted != 0 || len(res.Refused) != 3 {
		t.Fatalf("forwarded bad items: %+v %v", res, err)
	}
	for i, want := range []string{"not_own_instance", "invalid", "unknown_instance"} {
		if res.Refused[i].Code != want {
			t.Errorf("item %d refused %s, want %s", i, res.Refused[i].Code, want)
		}
	}
	if res, err := f.Evaluator.IngestForwarded(t.Context(), prober2, []evaluator.Report{{InstanceID: id(f.web[0]), Class: "probe", Outcome: "success"}}); err != nil || res.Accepted != 0 || res.Refused[0].Code != "not_assigned" {
		t.Fatalf("an unassigned prober, forwarded: %+v %v", res, err)
	}

	if got := metric(t, f, "muster_samples_forwarded_total", "result", "accepted"); got != 1 {
		t.Errorf("muster_samples_forwarded_total{result=accepted} = %v, want 1", got)
	}
	if got := metric(t, f, "muster_samples_forwarded_total", "result", "refused"); got != 4 {
		t.Errorf("muster_samples_forwarded_total{result=refused} = %v, want 4", got)
	}
	if got := metric(t, f, "muster_samples_accepted_total"); got != 0 {
		t.Errorf("muster_samples_accepted_total = %v, want 0 (forwarded evidence is counted where it was received)", got)
	}
	if got := metric(t, f, "muster_samples_refused_total", "reason", "not_own_instance"); got != 1 {
		t.Errorf("muster_samples_refused_total{not_own_instance} = %v, want 1 (the local Ingest only)", got)
	}
	// The forwarded evidence is in the owner's windows (this replica owns
	// every service: Config.Owns is unset).
	if err := f.Evaluator.FlushNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := metric(t, f, "muster_observed_windows_written_total"); n != 1 {
		t.Errorf("%v observed windows written for the forwarded evidence, want 1", n)
	}
}

// TestIngestKeepsOnlyWhatItEvaluates: a replica that neither owns nor
// stands by for a service (Config.Evaluates says no) attributes and
// answers a report about it as usual, names its service for the
// forwarder, and keeps nothing of it: no observed window. What it is
// forwarded about that service it keeps (the sender routed it there).
func TestIngestKeepsOnlyWhatItEvaluates(t *testing.T) {
	t.Parallel()
	f := newFixture(t, st.Options{Evaluator: func(c *evaluator.Config) {
		c.Evaluates = func(service string) bool { return service != "web" }
	}})
	prober := identity.Principal{Kind: identity.KindProber, Subject: "prober-az1"}
	items := []evaluator.Report{
		{InstanceID: uuid.MustParse(f.web[0]), Class: "probe", Outcome: "success"},
		{InstanceID: uuid.MustParse(f.web[1]), Class: "probe", Outcome: "meh"},
	}
	res, err := f.Evaluator.Ingest(t.Context(), prober, items)
	if err != nil || res.Accepted != 1 || len(res.Refused) != 1 || res.Refused[0].Code != "invalid" {
		t.Fatalf("Ingest about a service kept elsewhere: %+v %v", res, err)
	}
	if len(res.Services) != 2 || res.Services[0] != "web" || res.Services[1] != "" {
		t.Fatalf("services %q, want [web \"\"]", res.Services)
	}
	if got := metric(t, f, "muster_samples_accepted_total"); got != 1 {
		t.Errorf("muster_samples_accepted_total = %v, want 1 (accepted here, kept by its owner)", got)
	}
	if err := f.Evaluator.FlushNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := metric(t, f, "muster_observed_windows_written_total"); n != 0 {
		t.Errorf("%v observed windows written for evidence kept elsewhere, want 0", n)
	}
	if res, err := f.Evaluator.IngestForwarded(t.Context(), prober, items[:1]); err != nil || res.Accepted != 1 || res.Services != nil {
		t.Fatalf("IngestForwarded: %+v %v", res, err)
	}
	if err := f.Evaluator.FlushNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := metric(t, f, "muster_observed_windows_written_total"); n != 1 {
		t.Errorf("%v observed windows written for forwarded evidence, want 1", n)
	}
}

// TestReportsAboutServicesEvaluatedElsewhereGetTheSameAnswers: a replica
// that sees reports about services another replica evaluates answers each
// as it would about its own (probe, passive and self, accepted or refused
// for each reason), names the service of each accepted for the forwarder,
// and keeps only what is about the service it evaluates. Two rounds of
// the same calls get the same answers, item by item.
func TestReportsAboutServicesEvaluatedElsewhereGetTheSameAnswers(t *testing.T) {
	t.Parallel()
	f := newFixture(t, st.Options{Evaluator: func(c *evaluator.Config) {
		c.Evaluates = func(service string) bool { return service != "web" }
	}})
	id := func(s string) uuid.UUID { return uuid.MustParse(s) }
	prober1 := identity.Principal{Kind: identity.KindProber, Subject: "prober-az1"}
	prober2 := identity.Principal{Kind: identity.KindProber, Subject: "prober-az2"}
	web := identity.Principal{Kind: identity.KindWorkload, Service: "web", Subject: "web"}
	api := identity.Principal{Kind: identity.KindWorkload, Service: "api", Subject: "api"}
	type call struct {
		actor   identity.Principal
		reports []evaluator.Report
	}
	calls := []call{
		{prober1, []evaluator.Report{
			{InstanceID: id(f.web[0]), Class: "probe", Outcome: "success"},
			{InstanceID: id(f.web[1]), Class: "probe", Outcome: "meh"},
			{InstanceID: id(f.web[2]), Class: "passive", Outcome: "success"},
			{InstanceID: uuid.Must(uuid.NewV7()), Class: "probe", Outcome: "success"},
			{InstanceID: id(f.api[0]), Class: "probe", Outcome: "success"}, // not its assignment
			{InstanceID: id(f.web[0]), Class: "probe", Outcome: "success", Dependency: "db"},
		}},
		{prober2, []evaluator.Report{{InstanceID: id(f.web[0]), Class: "probe", Outcome: "hard_failure"}}},
		// No source address in the context: not the instance's own.
		{web, []evaluator.Report{{InstanceID: id(f.web[0]), Class: "self", Outcome: "success"}}},
		// api may not resolve web: it cannot have called it.
		{api, []evaluator.Report{
			{InstanceID: id(f.web[1]), Class: "passive", Outcome: "failure"},
			{InstanceID: id(f.api[0]), Class: "passive", Outcome: "success"},
		}},
		{web, []evaluator.Report{{InstanceID: id(f.web[1]), Class: "passive", Outcome: "failure"}}},
	}
	type answer struct {
		accepted int
		refused  []string
		services []string
	}
	take := func() []answer {
		var out []answer
		for _, c := range calls {
			res, err := f.Evaluator.Ingest(t.Context(), c.actor, c.reports)
			if err != nil {
				t.Fatal(err)
			}
			// No services named: none accepted.
			a := answer{accepted: res.Accepted, services: make([]string, len(c.reports))}
			copy(a.services, res.Services)
			for _, r := range res.Refused {
				a.refused = append(a.refused, fmt.Sprintf("%d:%s", r.Index, r.Code))
			}
			out = append(out, a)
		}
		return out
	}
	first, second := take(), take()
	want := []answer{
		{1, []string{"1:invalid", "2:wrong_identity_kind", "3:unknown_instance", "4:not_assigned", "5:invalid"}, []string{"web", "", "", "", "", ""}},
		{0, []string{"0:not_assigned"}, []string{""}},
		{0, []string{"0:not_own_instance"}, []string{""}},
		{1, []string{"0:not_granted"}, []string{"", "api"}},
		{1, nil, []string{"web"}},
	}
	for i := range want {
		for _, got := range []answer{first[i], second[i]} {
			if !reflect.DeepEqual(got, want[i]) {
				t.Errorf("call %d: %+v, want %+v", i, got, want[i])
			}
		}
	}
	// Only api's accepted report was kept here: one window (its
	// instance's passive class).
	if err := f.Evaluator.FlushNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := metric(t, f, "muster_observed_windows_written_total"); n != 1 {
		t.Errorf("%v observed windows written, want 1 (api's instance only)", n)
	}
}
