package eligibility_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/musterhq/muster/internal/eligibility"
)

func TestNamesRoundTrip(t *testing.T) {
	t.Parallel()
	for _, c := range []eligibility.Class{eligibility.Probe, eligibility.Self, eligibility.Passive} {
		got, err := eligibility.ParseClass(c.String())
		if err != nil || got != c {
			t.Errorf("ParseClass(%q) = %v, %v", c, got, err)
		}
	}
	for _, o := range []eligibility.Outcome{eligibility.Success, eligibility.Failure, eligibility.HardFailure, eligibility.Unobservable} {
		got, err := eligibility.ParseOutcome(o.String())
		if err != nil || got != o {
			t.Errorf("ParseOutcome(%q) = %v, %v", o, got, err)
		}
	}
	for _, s := range []eligibility.State{eligibility.Unknown, eligibility.Eligible, eligibility.Degraded, eligibility.Ineligible} {
		b, err := s.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var got eligibility.State
		if err := got.UnmarshalText(b); err != nil || got != s {
			t.Errorf("round trip %v: %v, %v", s, got, err)
		}
	}
	if _, err := eligibility.ParseClass("gossip"); err == nil {
		t.Error("ParseClass accepted gossip")
	}
	if _, err := eligibility.ParseOutcome(""); err == nil {
		t.Error("ParseOutcome accepted the empty string")
	}
	if a, err := eligibility.ParseAuthority(""); err != nil || a != eligibility.Weight {
		t.Errorf("default authority = %v, %v; want weight", a, err)
	}
	if got, want := iid(1).String(), "00000100-0000-0000-0000-000000000042"; got != want {
		t.Errorf("InstanceID.String() = %s, want %s", got, want)
	}
}

func TestContractValidate(t *testing.T) {
	t.Parallel()
	def := func(f func(*eligibility.Contract)) eligibility.Contract {
		c := eligibility.DefaultContract(allCaps)
		f(&c)
		return c
	}
	tests := []struct {
		name string
		c    eligibility.Contract
		want string // substring of the error; "" for valid
	}{
		{"defaults", eligibility.DefaultContract(allCaps), ""},
		{"stateless slow start 0", def(func(c *eligibility.Contract) { c.SlowStart = 0 }), ""},
		{"interval below floor", def(func(c *eligibility.Contract) { c.Interval = 500 * time.Millisecond }), "interval"},
		{"re-entry not below removal", def(func(c *eligibility.Contract) { c.ReentryThreshold = 0.5 }), "strictly below"},
		{"detection past 10 s", def(func(c *eligibility.Contract) { c.HalfLife = 20 * time.Second }), "at most 10s"},
		{"dwell below floor", def(func(c *eligibility.Contract) { c.MinDwell = time.Second }), "dwell"},
		{"weight for undeclared class", def(func(c *eligibility.Contract) { c.Capabilities.Passive = false }), "does not declare the passive"},
		{"no positive weight", def(func(c *eligibility.Contract) { c.Weights = [3]float64{} }), "positive weight"},
		{"require readiness without capability", def(func(c *eligibility.Contract) {
			c.Capabilities.Readiness, c.RequireReadiness = false, true
		}), "readiness capability"},
		{"shared unready", def(func(c *eligibility.Contract) {
			c.Dependencies = map[string]eligibility.Dependency{"db": {Shared: true, Authority: eligibility.Unready}}
		}), "shared dependency may not"},
		{"non-shared unready", def(func(c *eligibility.Contract) {
			c.Dependencies = map[string]eligibility.Dependency{"cache": {Authority: eligibility.Unready}}
		}), ""},
		{"one passive reporter", def(func(c *eligibility.Contract) { c.MinPassiveReporters = 1 }), ""},
		{"eight passive reporters", def(func(c *eligibility.Contract) { c.MinPassiveReporters = 8 }), ""},
		{"no passive reporters", def(func(c *eligibility.Contract) { c.MinPassiveReporters = 0 }), "minimum passive reporters"},
		{"nine passive reporters", def(func(c *eligibility.Contract) { c.MinPassiveReporters = 9 }), "minimum passive reporters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestContractFrom(t *testing.T) {
	t.Parallel()
	spec := eligibility.ContractSpec{
		IntervalSeconds: 5, HalfLifeSeconds: 4, RemovalThreshold: 0.5, ReentryThreshold: 0,
		MinDwellSeconds: 30, SlowStartSeconds: 0, PassivePrimaryRPS: 5,
		Capabilities: []string{"probe", "self"},
		Dependencies: []eligibility.DependencySpec{{Name: "db", Shared: true}, {Name: "cache", Authority: "unready"}},
	}
	got, err := eligibility.ContractFrom(spec)
	if err != nil {
		t.Fatal(err)
	}
	want := eligibility.Contract{
		Interval: 5 * time.Second, HalfLife: 4 * time.Second, MinDwell: 30 * time.Second,
		RemovalThreshold: 0.5, PassivePrimaryRPS: 5, Weights: [3]float64{1, 1, 0},
		MinPassiveReporters: eligibility.DefaultMinPassiveReporters,
		Capabilities:        eligibility.Capabilities{Probe: true, Self: true},
		Dependencies: map[string]eligibility.Dependency{
			"db":    {Shared: true, Authority: eligibility.Weight},
			"cache": {Authority: eligibility.Unready},
		},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("ContractFrom (-want +got):\n%s", d)
	}
	for name, bad := range map[string]eligibility.ContractSpec{
		"unknown capability": {Capabilities: []string{"telepathy"}},
		"unknown class weight": func() eligibility.ContractSpec {
			s := spec
			s.Weights = map[string]float64{"gossip": 1}
			return s
		}(),
		"shared unready": func() eligibility.ContractSpec {
			s := spec
			s.Dependencies = []eligibility.DependencySpec{{Name: "db", Shared: true, Authority: "unready"}}
			return s
		}(),
		"zero interval":          func() eligibility.ContractSpec { s := spec; s.IntervalSeconds = 0; return s }(),
		"nine passive reporters": func() eligibility.ContractSpec { s := spec; s.MinPassiveReporters = 9; return s }(),
	} {
		if _, err := eligibility.ContractFrom(bad); err == nil {
			t.Errorf("%s: ContractFrom accepted it", name)
		}
	}
}

func TestObserveErrors(t *testing.T) {
	t.Parallel()
	s := newSim(t, eligibility.Options{})
	s.service("svc", contract(allCaps))
	id := s.add(1, "svc")
	tests := []struct {
		name string
		smp  eligibility.Sample
		want error
	}{
		{"unknown instance", eligibility.Sample{Instance: iid(99), Outcome: eligibility.Success, At: t0}, eligibility.ErrUnknownInstance},
		{"bad class", eligibility.Sample{Instance: id, Class: 7, Outcome: eligibility.Success, At: t0}, eligibility.ErrInvalidSample},
		{"zero time", eligibility.Sample{Instance: id, Outcome: eligibility.Success}, eligibility.ErrInvalidSample},
		{"no outcome", eligibility.Sample{Instance: id, At: t0}, eligibility.ErrInvalidSample},
		{"aggregate without outcome", eligibility.Sample{Instance: id, Class: eligibility.Passive, At: t0, Successes: 3}, nil},
		{"unobservable", eligibility.Sample{Instance: id, Outcome: eligibility.Unobservable, At: t0}, nil},
	}
	for _, tt := range tests {
		if err := s.e.Observe(tt.smp); !errors.Is(err, tt.want) {
			t.Errorf("%s: Observe() = %v, want %v", tt.name, err, tt.want)
		}
	}
	if err := s.e.AddInstance(id, "svc", t0); !errors.Is(err, eligibility.ErrDuplicateInstance) {
		t.Errorf("second AddInstance = %v, want ErrDuplicateInstance", err)
	}
	if err := s.e.AddInstance(iid(2), "nope", t0); !errors.Is(err, eligibility.ErrUnknownService) {
		t.Errorf("AddInstance to unknown service = %v, want ErrUnknownService", err)
	}
}
