package assembler_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/eligibility"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const (
	elig  = eligibility.Eligible
	degr  = eligibility.Degraded
	unk   = eligibility.Unknown
	inelg = eligibility.Ineligible
)

// id returns a deterministic instance id.
func id(n int) uuid.UUID {
	var u uuid.UUID
	u[0], u[1], u[15] = byte(n>>8), byte(n), 0x42
	return u
}

// versions is a VersionSource backed by a counter; failNext makes the next
// calls fail.
type versions struct {
	next     uint64
	failNext int
	calls    int
}

var errSource = errors.New("sequence unavailable")

func (v *versions) Next(n int) (uint64, error) {
	v.calls++
	if v.failNext > 0 {
		v.failNext--
		// A failing reservation may still have burnt versions.
		v.next += uint64(n)
		return 0, errSource
	}
	first := v.next + 1
	v.next += uint64(n)
	return first, nil
}

func inst(n int, zone string, st eligibility.State) assembler.InstanceInput {
	return assembler.InstanceInput{
		ID: id(n), Address: "10.0.0." + string(rune('0'+n%10)), Port: 8000 + n, Zone: zone,
		State: st, Weight: 1, HealthKnown: true,
	}
}

// zoned builds n instances per zone, ids from base, all in state st.
func zoned(base int, st eligibility.State, n int, zones ...string) []assembler.InstanceInput {
	var out []assembler.InstanceInput
	for zi, z := range zones {
		for i := range n {
			out = append(out, inst(base+zi*n+i, z, st))
		}
	}
	return out
}

func svc(name string, frac float64, ins []assembler.InstanceInput) assembler.ServiceInput {
	return assembler.ServiceInput{Name: name, MinHealthyFraction: frac, Capabilities: []string{"probe", "readiness"}, Instances: ins}
}

// drainAt drains at now and fails the test on error.
func drainAt(t testing.TB, a *assembler.Assembler, now time.Time, vs assembler.VersionSource) []assembler.Published {
	t.Helper()
	out, err := a.Drain(now, vs)
	if err != nil {
		t.Fatalf("Drain at %v: %v", now.Sub(t0), err)
	}
	return out
}

// settle drains everything queued, however long the windows.
func settle(t testing.TB, a *assembler.Assembler, now time.Time, vs assembler.VersionSource) []assembler.Published {
	t.Helper()
	return drainAt(t, a, now.Add(time.Hour), vs)
}

func mustView(t testing.TB, a *assembler.Assembler, service string) *assembler.View {
	t.Helper()
	v, ok := a.View(service)
	if !ok {
		t.Fatalf("no view of %s", service)
	}
	return v
}

func byID(v *assembler.View) map[uuid.UUID]assembler.Endpoint {
	m := map[uuid.UUID]assembler.Endpoint{}
	for _, e := range v.Endpoints {
		m[e.InstanceID] = e
	}
	return m
}

func zoneIDs(v *assembler.View, zone string) int {
	n := 0
	for _, e := range v.Endpoints {
		if e.Zone == zone {
			n++
		}
	}
	return n
}

func set(ins []assembler.InstanceInput, st eligibility.State, ns ...int) []assembler.InstanceInput {
	out := append([]assembler.InstanceInput(nil), ins...)
	for i := range out {
		for _, n := range ns {
			if out[i].ID == id(n) {
				out[i].State = st
				out[i].Weight = 1
				if st == inelg {
					out[i].Weight = 0
				}
			}
		}
	}
	return out
}
