package tgsync

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/musterhq/muster/resolver"
)

func k(i int) Key { return Key{Addr: fmt.Sprintf("10.0.0.%d", i), Port: 80} }

func wants(ids ...int) []Want {
	var out []Want
	for _, i := range ids {
		out = append(out, Want{Key: k(i), Weight: 100})
	}
	return out
}

func haves(ids ...int) []Have {
	var out []Have
	for _, i := range ids {
		out = append(out, Have{Key: k(i)})
	}
	return out
}

func keysOfWant(ws []Want) []int {
	out := []int{}
	for _, w := range ws {
		var i int
		fmt.Sscanf(w.Addr, "10.0.0.%d", &i)
		out = append(out, i)
	}
	return out
}

func keysOfHave(hs []Have) []int {
	out := []int{}
	for _, h := range hs {
		var i int
		fmt.Sscanf(h.Addr, "10.0.0.%d", &i)
		out = append(out, i)
	}
	return out
}

func set(ids ...int) func(Key) bool {
	m := map[Key]bool{}
	for _, i := range ids {
		m[k(i)] = true
	}
	return func(x Key) bool { return m[x] }
}

func seq(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

var defaults = Policy{MaxDeregisterFraction: 0.10, AddStepFraction: 0.25}

// TestCompute: the reconcile core's decisions, one table row per rule.
func TestCompute(t *testing.T) {
	type want struct {
		register, deferredReg, dereg, deferredDereg, unmanaged []int
		explained                                              int
		held                                                   string
	}
	cases := []struct {
		name string
		in   Input
		want want
	}{
		{
			name: "an empty group takes every addition at once, even without a ramp",
			in:   Input{Desired: wants(1, 2, 3), Known: set(1, 2, 3), InView: set(1, 2, 3), Policy: defaults},
			want: want{register: []int{1, 2, 3}},
		},
		{
			name: "without a backend ramp additions come in steps of a quarter of the group",
			in: Input{Desired: wants(1, 2, 3, 4, 5, 6, 7), Current: haves(1, 2, 3, 4), Known: set(seq(1, 7)...),
				InView: set(seq(1, 7)...), Policy: defaults},
			want: want{register: []int{5}, deferredReg: []int{6, 7}},
		},
		{
			name: "a step already taken this interval leaves none for now",
			in: Input{Desired: wants(1, 2, 3, 4, 5), Current: haves(1, 2, 3, 4), Known: set(seq(1, 5)...),
				InView: set(seq(1, 5)...), Policy: defaults, RegisteredRecently: 1},
			want: want{deferredReg: []int{5}},
		},
		{
			name: "a backend that ramps (slow start, weights) takes them all",
			in: Input{Desired: wants(1, 2, 3, 4, 5, 6, 7), Current: haves(1, 2, 3, 4), Known: set(seq(1, 7)...),
				InView: set(seq(1, 7)...), Policy: defaults, BackendRamps: true},
			want: want{register: []int{5, 6, 7}},
		},
		{
			name: "three withdrawn of ten: one now (10%), two wait",
			in: Input{Desired: wants(seq(4, 10)...), Current: haves(seq(1, 10)...), Known: set(seq(1, 10)...),
				InView: set(seq(1, 10)...), Registered: 10, RegisteredKnown: true, Policy: defaults},
			want: want{dereg: []int{1}, deferredDereg: []int{2, 3}},
		},
		{
			name: "the interval's budget already spent: nothing now",
			in: Input{Desired: wants(seq(2, 10)...), Current: haves(seq(1, 10)...), Known: set(seq(1, 10)...),
				InView: set(seq(1, 10)...), Registered: 10, RegisteredKnown: true, Policy: defaults, DeregisteredRecently: 1},
			want: want{deferredDereg: []int{1}},
		},
		{
			name: "a 10 to 4 scale-down the registry lists is followed at once",
			in: Input{Desired: wants(seq(1, 4)...), Current: haves(seq(1, 10)...), Known: set(seq(1, 10)...),
				InView: set(seq(1, 4)...), Registered: 4, RegisteredKnown: true, Policy: defaults},
			want: want{dereg: []int{5, 6, 7, 8, 9, 10}, explained: 6},
		},
		{
			name: "endpoints missing from a view whose registry still lists ten are capped",
			in: Input{Desired: wants(seq(1, 4)...), Current: haves(seq(1, 10)...), Known: set(seq(1, 10)...),
				InView: set(seq(1, 4)...), Registered: 10, RegisteredKnown: true, Policy: defaults},
			// Addresses sort as text: 10.0.0.10 comes first.
			want: want{dereg: []int{10}, deferredDereg: []int{5, 6, 7, 8, 9}},
		},
		{
			name: "a view that does not say what the registry lists gets the cap",
			in: Input{Desired: wants(seq(1, 4)...), Current: haves(seq(1, 10)...), Known: set(seq(1, 10)...),
				InView: set(seq(1, 4)...), Policy: defaults},
			// Addresses sort as text: 10.0.0.10 comes first.
			want: want{dereg: []int{10}, deferredDereg: []int{5, 6, 7, 8, 9}},
		},
		{
			name: "an empty desired set deregisters nothing",
			in: Input{Current: haves(1, 2, 3), Known: set(1, 2, 3), InView: set(1, 2, 3), Registered: 3, RegisteredKnown: true,
				Policy: defaults},
			want: want{deferredDereg: []int{1, 2, 3}, held: HeldEmpty},
		},
		{
			name: "even a decommission the registry explains leaves the group as it is",
			in:   Input{Current: haves(1, 2, 3), Known: set(1, 2, 3), InView: set(), Registered: 0, RegisteredKnown: true, Policy: defaults},
			want: want{deferredDereg: []int{1, 2, 3}, held: HeldEmpty},
		},
		{
			name: "a target registered by hand is reported and left alone",
			in: Input{Desired: wants(1, 2), Current: haves(1, 2, 9), Known: set(1, 2), InView: set(1, 2),
				Registered: 2, RegisteredKnown: true, Policy: defaults},
			want: want{unmanaged: []int{9}},
		},
		{
			name: "with own_group it is deregistered like any other, capped",
			in: Input{Desired: wants(1, 2), Current: haves(1, 2, 8, 9), Known: set(1, 2), InView: set(1, 2),
				Registered: 2, RegisteredKnown: true, Policy: Policy{MaxDeregisterFraction: 0.1, AddStepFraction: 0.25, OwnGroup: true}},
			want: want{dereg: []int{8}, deferredDereg: []int{9}, explained: 0},
		},
		{
			name: "a swap whose addition must wait does not remove first",
			in: Input{Desired: wants(2), Current: haves(1), Known: set(1, 2), InView: set(1, 2), Registered: 2, RegisteredKnown: true,
				Policy: defaults, RegisteredRecently: 1},
			want: want{deferredReg: []int{2}, deferredDereg: []int{1}},
		},
		{
			name: "a swap with its step free registers then deregisters",
			in: Input{Desired: wants(2), Current: haves(1), Known: set(1, 2), InView: set(1, 2), Registered: 2, RegisteredKnown: true,
				Policy: defaults},
			want: want{register: []int{2}, dereg: []int{1}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := Compute(c.in)
			got := want{
				register: keysOfWant(p.Register), deferredReg: keysOfWant(p.DeferredRegister),
				dereg: keysOfHave(p.Deregister), deferredDereg: keysOfHave(p.DeferredDeregister),
				unmanaged: keysOfHave(p.Unmanaged), explained: p.Explained, held: p.Held,
			}
			norm := func(w want) want {
				for _, s := range []*[]int{&w.register, &w.deferredReg, &w.dereg, &w.deferredDereg, &w.unmanaged} {
					if *s == nil {
						*s = []int{}
					}
				}
				return w
			}
			if d := cmp.Diff(norm(c.want), norm(got), cmp.AllowUnexported(want{})); d != "" {
				t.Errorf("plan (-want +got):\n%s\n%s", d, p.Describe())
			}
		})
	}
}

// TestComputeReweights: a weight the view changed is set again; a backend
// without weights (ELBv2 reports 0) is never reweighted.
func TestComputeReweights(t *testing.T) {
	in := Input{Desired: []Want{{Key: k(1), Weight: 50}, {Key: k(2), Weight: 100}},
		Current: []Have{{Key: k(1), Weight: 100}, {Key: k(2), Weight: 100}}, Known: set(1, 2), InView: set(1, 2), Policy: defaults}
	if p := Compute(in); len(p.Reweight) != 1 || p.Reweight[0].Key != k(1) || p.Reweight[0].Weight != 50 {
		t.Fatalf("reweight: %+v", p.Reweight)
	}
	in.Current = haves(1, 2)
	if p := Compute(in); len(p.Reweight) != 0 {
		t.Fatalf("ELBv2 reweighted: %+v", p.Reweight)
	}
}

// TestDesired: the port override, the weight scale and its bounds, and
// two endpoints landing on one target.
func TestDesired(t *testing.T) {
	ts := []resolver.Target{
		{Endpoint: resolver.Endpoint{InstanceID: "b", Address: "10.0.0.2", Port: 9000, Zone: "az1"}, Share: 0.1},
		{Endpoint: resolver.Endpoint{InstanceID: "a", Address: "10.0.0.1", Port: 9000, Zone: "az1"}, Share: 1},
		{Endpoint: resolver.Endpoint{InstanceID: "c", Address: "10.0.0.1", Port: 9001, Zone: "az1"}, Share: 0.001},
		{Endpoint: resolver.Endpoint{InstanceID: "d", Address: "10.0.0.3", Port: 9000, Zone: "az2"}, Share: 9},
	}
	got := Desired(ts, 0)
	want := []Want{
		{Key: Key{"10.0.0.1", 9000}, InstanceID: "a", Zone: "az1", Weight: 100},
		{Key: Key{"10.0.0.1", 9001}, InstanceID: "c", Zone: "az1", Weight: 1},
		{Key: Key{"10.0.0.2", 9000}, InstanceID: "b", Zone: "az1", Weight: 10},
		{Key: Key{"10.0.0.3", 9000}, InstanceID: "d", Zone: "az2", Weight: MaxWeight},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Desired (-want +got):\n%s", d)
	}
	over := Desired(ts, 80)
	if len(over) != 3 || over[0].Key != (Key{"10.0.0.1", 80}) || over[0].Weight != 100 {
		t.Errorf("Desired with port 80: %+v", over)
	}
}
