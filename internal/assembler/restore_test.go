package assembler_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
)

// persisted is what the publisher keeps of a published view: its JSON.
func persisted(t testing.TB, v *assembler.View) *assembler.View {
	t.Helper()
	var back assembler.View
	if err := json.Unmarshal(v.Encoded(), &back); err != nil {
		t.Fatal(err)
	}
	return &back
}

// restarted returns a new assembler seeded with what a has published for
// each service, as a restarted process would be from PostgreSQL.
func restarted(t testing.TB, a *assembler.Assembler, services ...string) *assembler.Assembler {
	t.Helper()
	b := assembler.New(assembler.Options{})
	for _, s := range services {
		if err := b.Restore(persisted(t, mustView(t, a, s))); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// applyDelta applies d to a client's copy of view v (as resolver does).
func applyDelta(t testing.TB, v *assembler.View, d *assembler.Delta) []assembler.Endpoint {
	t.Helper()
	if d.FromVersion != v.Version {
		t.Fatalf("delta from %d, client holds %d", d.FromVersion, v.Version)
	}
	m := byID(v)
	for _, id := range d.Removals {
		if _, ok := m[id]; !ok {
			t.Fatalf("removal of %v the client does not hold", id)
		}
		delete(m, id)
	}
	for _, e := range d.Upserts {
		m[e.InstanceID] = e
	}
	out := make([]assembler.Endpoint, 0, len(m))
	for _, e := range m {
		out = append(out, e)
	}
	return out
}

func TestRestore(t *testing.T) {
	t.Parallel()
	ins := zoned(0, elig, 3, "a", "b") // ids 0-2 in a, 3-5 in b
	tests := []struct {
		name string
		// restored is what the earlier process last published.
		restored []assembler.InstanceInput
		// first is the restarted evaluator's input.
		first []assembler.InstanceInput
		// withdrawal: the first version is due on the withdrawal window.
		withdrawal   bool
		upserts      []uuid.UUID
		removals     []uuid.UUID
		zones        []string // zones whose status the first delta carries
		removedZones []string
		lastInstance string // a substring of the alarm's detail; "" for none
	}{
		{
			name: "the same set: one version, no endpoint in it", restored: ins, first: ins,
		},
		{
			name: "fewer instances: their withdrawal from the restored version", restored: ins, first: ins[:4],
			withdrawal: true, removals: []uuid.UUID{id(4), id(5)}, zones: []string{"b"},
		},
		{
			name: "one fails: withdrawn", restored: ins, first: set(ins, inelg, 0),
			withdrawal: true, removals: []uuid.UUID{id(0)}, zones: []string{"a"},
		},
		{
			name: "one added", restored: ins[:5], first: ins,
			upserts: []uuid.UUID{id(5)}, zones: []string{"b"},
		},
		{
			name: "clients had capacity, the restarted input has none in rotation", restored: ins, first: set(ins, inelg, 0, 1, 2, 3, 4, 5),
			upserts: []uuid.UUID{id(0), id(1), id(2), id(3), id(4), id(5)}, zones: []string{"a", "b"},
			lastInstance: "0 of 6 instances",
		},
		{
			name: "clients had capacity, the restarted input has no instance", restored: ins, first: nil,
			withdrawal: true, removals: []uuid.UUID{id(0), id(1), id(2), id(3), id(4), id(5)}, removedZones: []string{"a", "b"},
			lastInstance: "removed from the registry",
		},
		{
			name: "clients had none in rotation (the guard published them all): no incident", restored: set(ins, inelg, 0, 1, 2, 3, 4, 5),
			first: set(ins, inelg, 0, 1, 2, 3, 4, 5),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			before := assembler.New(assembler.Options{})
			before.Update(svc("web", 0.5, tc.restored), t0)
			settle(t, before, t0, &versions{})
			held := mustView(t, before, "web")

			a := restarted(t, before, "web")
			if got := mustView(t, a, "web"); !bytes.Equal(got.Encoded(), held.Encoded()) || got.Version != held.Version {
				t.Fatalf("View after Restore differs from the one published:\n%s\n%s", got.Encoded(), held.Encoded())
			}
			if due := a.NextDue(); !due.IsZero() {
				t.Fatalf("a restored service is due before its first Update: %v", due)
			}
			now := t0.Add(time.Hour)
			a.Update(svc("web", 0.5, tc.first), now)
			got := lastInstance(a)
			if tc.lastInstance == "" && got.Kind != "" {
				t.Fatalf("last_instance raised: %+v", got)
			}
			if tc.lastInstance != "" && (!got.Since.Equal(now) || !strings.Contains(got.Detail, tc.lastInstance)) {
				t.Fatalf("last_instance = %+v, want one saying %q", got, tc.lastInstance)
			}

			vs := &versions{next: 1000} // a later epoch
			wait := time.Second         // the addition window
			if tc.withdrawal {
				wait = 0 // the withdrawal queue is idle: its leading edge
			}
			if wait > 0 {
				if early := drainAt(t, a, now.Add(wait-time.Millisecond), vs); len(early) != 0 {
					t.Fatalf("published before its window: %+v", early[0].Delta)
				}
			}
			pubs := drainAt(t, a, now.Add(wait), vs)
			if len(pubs) != 1 {
				t.Fatalf("%d versions published, want 1", len(pubs))
			}
			p := pubs[0]
			d := p.Delta
			if d == nil || d.FromVersion != held.Version || d.Version != 1001 || d.Withdrawal != tc.withdrawal {
				t.Fatalf("first delta after the restart: %+v", d)
			}
			ids := func(eps []assembler.Endpoint) []uuid.UUID {
				var out []uuid.UUID
				for _, e := range eps {
					out = append(out, e.InstanceID)
				}
				return out
			}
			var zones []string
			for z := range d.Zones {
				zones = append(zones, z)
			}
			if diff := cmp.Diff(tc.upserts, ids(d.Upserts), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("upserts (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.removals, d.Removals, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("removals (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.zones, zones, cmpopts.EquateEmpty(), cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
				t.Errorf("zones in the delta (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.removedZones, d.RemovedZones, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("removed zones (-want +got):\n%s", diff)
			}
			// Checksum continuity: a client holding the restored view
			// applies the delta and gets the new view, whose checksum is
			// the one over its endpoints.
			client := applyDelta(t, held, d)
			if sum := assembler.Checksum(client); sum != d.Checksum || sum != p.View.Checksum || p.View.Checksum != assembler.Checksum(p.View.Endpoints) {
				t.Fatalf("checksums: client %s, delta %s, view %s", sum, d.Checksum, p.View.Checksum)
			}
			if diff := cmp.Diff(p.View.Endpoints, client, cmpopts.SortSlices(func(a, b assembler.Endpoint) bool {
				return bytes.Compare(a.InstanceID[:], b.InstanceID[:]) < 0
			})); diff != "" {
				t.Fatalf("client after the delta (-view +client):\n%s", diff)
			}
			var back assembler.View
			if err := json.Unmarshal(p.ViewJSON, &back); err != nil || back.Checksum != p.View.Checksum {
				t.Fatalf("ViewJSON: %v", err)
			}
			// After that first version, the same input publishes nothing.
			a.Update(svc("web", 0.5, tc.first), now.Add(time.Minute))
			if more := settle(t, a, now.Add(time.Minute), vs); len(more) != 0 {
				t.Fatalf("the same input published again: %+v", more[0].Delta)
			}
		})
	}
}

// Restore refuses what it cannot stand behind, and Drain refuses versions
// not above a restored one.
func TestRestoreRefuses(t *testing.T) {
	t.Parallel()
	src := assembler.New(assembler.Options{})
	src.Update(svc("web", 0.5, zoned(0, elig, 3, "a")), t0)
	settle(t, src, t0, &versions{next: 500})
	good := persisted(t, mustView(t, src, "web"))
	clone := func() *assembler.View {
		b, err := json.Marshal(good)
		if err != nil {
			t.Fatal(err)
		}
		var v assembler.View
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		return &v
	}

	badSum := clone()
	badSum.Endpoints[0].Port++
	dup := clone()
	dup.Endpoints = append(dup.Endpoints, dup.Endpoints[0])
	dup.Checksum = assembler.Checksum(dup.Endpoints)
	noVersion := clone()
	noVersion.Version = 0
	for name, v := range map[string]*assembler.View{"checksum": badSum, "duplicate": dup, "version 0": noVersion, "nil": nil} {
		a := assembler.New(assembler.Options{})
		if err := a.Restore(v); !errors.Is(err, assembler.ErrRestore) {
			t.Errorf("%s: Restore = %v", name, err)
		}
		if _, ok := a.View("web"); ok {
			t.Errorf("%s: a refused view is held", name)
		}
	}

	a := assembler.New(assembler.Options{})
	if err := a.Restore(good); err != nil {
		t.Fatal(err)
	}
	if err := a.Restore(good); !errors.Is(err, assembler.ErrRestore) {
		t.Fatalf("a second Restore of the same service: %v", err)
	}
	a.Update(svc("web", 0.5, zoned(0, elig, 2, "a")), t0.Add(time.Hour))
	if _, err := a.Drain(t0.Add(2*time.Hour), &versions{next: good.Version - 1}); !errors.Is(err, assembler.ErrVersionNotFresh) {
		t.Fatalf("a version at the restored one: %v", err)
	}
	if p := settle(t, a, t0.Add(2*time.Hour), &versions{next: good.Version}); len(p) != 1 || p[0].Delta.FromVersion != good.Version {
		t.Fatalf("after a refused Drain: %+v", p)
	}
}

// A restored service the first Update never names is withdrawn by
// RemoveService like any published service.
func TestRestoreThenRemove(t *testing.T) {
	t.Parallel()
	src := assembler.New(assembler.Options{})
	src.Update(svc("web", 0.5, zoned(0, elig, 2, "a")), t0)
	settle(t, src, t0, &versions{})
	a := restarted(t, src, "web")
	a.RemoveService("web", t0.Add(time.Hour))
	p := settle(t, a, t0.Add(time.Hour), &versions{next: 100})
	if len(p) != 1 || len(p[0].Delta.Removals) != 2 || !p[0].Delta.Withdrawal || len(p[0].View.Endpoints) != 0 {
		t.Fatalf("removal of a restored service: %+v", p)
	}
	if _, ok := a.View("web"); ok {
		t.Fatal("the removed service is still held")
	}
}
