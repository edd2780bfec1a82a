package reconcile

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func id(n int) uuid.UUID { return uuid.NewSHA1(uuid.Nil, []byte(fmt.Sprint(n))) }

func ep(n int, ready, serving, terminating bool) Endpoint {
	return Endpoint{Service: "web", Key: fmt.Sprint(n), Address: fmt.Sprintf("10.0.0.%d", n), Port: 8080, Zone: "az1",
		Ready: ready, Serving: serving, Terminating: terminating, ID: id(n)}
}

func live(ns ...int) []Live {
	var out []Live
	for _, n := range ns {
		out = append(out, Live{ID: id(n), Service: "web", Address: fmt.Sprintf("10.0.0.%d", n), Port: 8080, Zone: "az1"})
	}
	return out
}

func ids(ns ...int) []uuid.UUID {
	var out []uuid.UUID
	for _, n := range ns {
		out = append(out, id(n))
	}
	sortIDs(out)
	return out
}

func idsOf(es []Endpoint) []uuid.UUID {
	var out []uuid.UUID
	for _, e := range es {
		out = append(out, e.ID)
	}
	sortIDs(out)
	return out
}

func readyN(from, to int) []Endpoint {
	var out []Endpoint
	for n := from; n <= to; n++ {
		out = append(out, ep(n, true, true, false))
	}
	return out
}

func TestDecide(t *testing.T) {
	d := Disbelief{}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	held := &Hold{Since: t0.Add(-time.Minute), Had: 10, Lacking: 3, Services: []string{"web"}}
	cases := []struct {
		name      string
		reading   []Endpoint
		live      []Live
		prev      *Hold
		confirmed Confirmation
		now       time.Time
		create    []uuid.UUID
		end       []uuid.UUID
		held      []uuid.UUID
		ready     []uuid.UUID
		unready   []uuid.UUID
		hold      bool
		released  string
	}{
		{name: "new ready endpoints become instances", reading: readyN(1, 3),
			create: ids(1, 2, 3), ready: ids(1, 2, 3)},
		{name: "a not-ready endpoint is not an instance: a startup failure", reading: []Endpoint{ep(1, false, false, false)},
			unready: ids(1)},
		{name: "a terminating endpoint never becomes a new instance", reading: []Endpoint{ep(1, false, true, true)}},
		{name: "an instance stays while unready: readiness is evidence", reading: []Endpoint{ep(1, false, false, false)}, live: live(1),
			ready: ids(1)},
		{name: "terminating but serving stays routable", reading: []Endpoint{ep(1, false, true, true)}, live: live(1),
			ready: ids(1)},
		{name: "terminating and no longer serving ends", reading: []Endpoint{ep(1, false, false, true)}, live: live(1),
			end: ids(1)},
		{name: "gone ends", reading: readyN(2, 10), live: live(1, 2, 3, 4, 5, 6, 7, 8, 9, 10),
			end: ids(1), ready: ids(2, 3, 4, 5, 6, 7, 8, 9, 10)},
		{name: "a small service scaled down is believed (under MinRemovals)", reading: readyN(1, 1), live: live(1, 2, 3),
			end: ids(2, 3), ready: ids(1)},
		{name: "20% exactly is believed", reading: readyN(1, 12), live: live(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
			end: ids(13, 14, 15), ready: ids(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)},
		{name: "30% gone is held", reading: readyN(1, 7), live: live(1, 2, 3, 4, 5, 6, 7, 8, 9, 10),
			held: ids(8, 9, 10), ready: ids(1, 2, 3, 4, 5, 6, 7), hold: true},
		{name: "terminations are believed while absences are held", reading: append(readyN(1, 6), ep(7, false, false, true)), live: live(1, 2, 3, 4, 5, 6, 7, 8, 9, 10),
			end: ids(7), held: ids(8, 9, 10), ready: ids(1, 2, 3, 4, 5, 6), hold: true},
		{name: "held: still held", reading: readyN(1, 7), live: live(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), prev: held,
			now: t0, held: ids(8, 9, 10), ready: ids(1, 2, 3, 4, 5, 6, 7), hold: true},
		{name: "held, the same reading an hour later: still held (no timer releases a hold)", reading: readyN(1, 7), live: live(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), prev: held,
			now: t0.Add(time.Hour), held: ids(8, 9, 10), ready: ids(1, 2, 3, 4, 5, 6, 7), hold: true},
		{name: "held, confirmed by an operator: released", reading: readyN(1, 7), live: live(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), prev: held,
			confirmed: Confirmation{At: t0, Instances: ids(8, 9, 10)}, now: t0, end: ids(8, 9, 10), ready: ids(1, 2, 3, 4, 5, 6, 7), released: "operator"},
		{name: "a confirmation naming only some of the absent releases nothing: the hold grew after it", reading: readyN(1, 7), live: live(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), prev: held,
			confirmed: Confirmation{At: t0, Instances: ids(8, 9)}, now: t0, held: ids(8, 9, 10), ready: ids(1, 2, 3, 4, 5, 6, 7), hold: true},
		{name: "a confirmation older than the hold releases nothing", reading: readyN(1, 7), live: live(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), prev: held,
			confirmed: Confirmation{At: t0.Add(-time.Hour), Instances: ids(8, 9, 10)}, now: t0, held: ids(8, 9, 10), ready: ids(1, 2, 3, 4, 5, 6, 7), hold: true},
		{name: "held, the instances come back: released, nothing ends", reading: readyN(1, 10), live: live(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), prev: held,
			now: t0, ready: ids(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), released: "again"},
		{name: "an empty reading of a full source is held", reading: nil, live: live(1, 2, 3, 4, 5),
			held: ids(1, 2, 3, 4, 5), hold: true},
		{name: "an empty reading is held below the minimum mass too", reading: nil, live: live(1, 2),
			held: ids(1, 2), hold: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			now := c.now
			if now.IsZero() {
				now = t0
			}
			p := Decide(d, Reading{Endpoints: c.reading}, c.live, c.prev, c.confirmed, now)
			for _, x := range []struct {
				what      string
				got, want []uuid.UUID
			}{
				{"create", idsOf(p.Create), c.create}, {"end", p.End, c.end}, {"held", p.Held, c.held},
				{"readiness", idsOf(p.Readiness), c.ready}, {"unready", idsOf(p.Unready), c.unready},
			} {
				if diff := cmp.Diff(x.want, x.got); diff != "" {
					t.Errorf("%s (-want +got):\n%s", x.what, diff)
				}
			}
			if (p.Hold != nil) != c.hold {
				t.Errorf("hold = %+v, want held %v", p.Hold, c.hold)
			}
			if c.released == "" && p.Released != "" || !strings.Contains(p.Released, c.released) {
				t.Errorf("released = %q, want it to mention %q", p.Released, c.released)
			}
		})
	}
}

func TestDecideHoldNumbersAndNoTimer(t *testing.T) {
	d := Disbelief{Fraction: 0.25, MinRemovals: 2, Window: 30 * time.Second}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	p := Decide(d, Reading{Endpoints: readyN(1, 5)}, live(1, 2, 3, 4, 5, 6, 7, 8), nil, Confirmation{}, t0)
	want := &Hold{Since: t0, Had: 8, Lacking: 3, Services: []string{"web"}, Whole: true}
	if diff := cmp.Diff(want, p.Hold); diff != "" {
		t.Fatalf("hold (-want +got):\n%s", diff)
	}
	// The hold keeps its start across readings, however long the same
	// reading repeats: only recovery or a confirmation releases it.
	prev := p.Hold
	for _, after := range []time.Duration{29 * time.Second, 30 * time.Second, 10 * time.Minute, 24 * time.Hour} {
		p2 := Decide(d, Reading{Endpoints: readyN(1, 5)}, live(1, 2, 3, 4, 5, 6, 7, 8), prev, Confirmation{}, t0.Add(after))
		if p2.Hold == nil || !p2.Hold.Since.Equal(t0) || len(p2.End) != 0 || p2.Released != "" {
			t.Fatalf("the same reading %s later: hold %+v, ended %d, released %q; want still held since %s", after, p2.Hold, len(p2.End), p2.Released, t0)
		}
		prev = p2.Hold
	}
	p3 := Decide(d, Reading{Endpoints: readyN(1, 5)}, live(1, 2, 3, 4, 5, 6, 7, 8), prev, Confirmation{At: t0.Add(time.Hour), Instances: ids(6, 7, 8)}, t0.Add(25*time.Hour))
	if p3.Hold != nil || len(p3.End) != 3 {
		t.Fatalf("confirmed: hold %+v, ended %d; want released, 3 ended", p3.Hold, len(p3.End))
	}
}

func TestDisbeliefValidate(t *testing.T) {
	for _, d := range []Disbelief{{Fraction: 1}, {Fraction: -0.1}, {MinRemovals: -1}, {Window: -time.Second}} {
		if err := d.Validate(); err == nil {
			t.Errorf("%+v: accepted", d)
		}
	}
}

func TestDiffOf(t *testing.T) {
	src := SourceView{Name: "k8s/prod",
		Reading: Reading{Endpoints: []Endpoint{ep(1, true, true, false), ep(2, false, false, false), ep(3, true, true, false), ep(4, true, true, false), ep(5, false, false, true)}},
		Plan:    Plan{Unready: []Endpoint{ep(2, false, false, false)}, Held: ids(6)},
		Skipped: map[uuid.UUID]string{id(4): "no service named web in the registry"},
	}
	zoned := live(3)[0]
	zoned.Zone = "az2"
	leak := Live{ID: id(100), Service: "web", Address: "10.9.9.9", Port: 8080, Zone: "az1"}
	collide := Live{ID: id(101), Service: "web", Address: "10.0.0.1", Port: 8080, Zone: "az1"}
	reg := []Registered{
		{Live: live(1)[0], Source: "k8s/prod"},
		{Live: zoned, Source: "k8s/prod"},
		{Live: live(6)[0], Source: "k8s/prod"},
		{Live: live(7)[0], Source: "k8s/prod"},
		{Live: leak, Source: "registered"},
		{Live: collide, Source: "registered"},
		{Live: live(8)[0], Source: "k8s/gone"},
	}
	got := DiffOf([]SourceView{src}, reg)
	type row struct {
		Kind     DiffKind
		Source   string
		Instance uuid.UUID
		Detail   string
	}
	var rows []row
	for _, it := range got {
		rows = append(rows, row{it.Kind, it.Source, it.Instance, it.Detail})
	}
	want := []struct {
		kind   DiffKind
		source string
		id     uuid.UUID
		detail string
	}{
		{DiffLeak, "k8s/gone", id(8), "not a configured source"},
		{DiffMissing, "k8s/prod", id(2), "startup failure"},
		{DiffMissing, "k8s/prod", id(4), "registry refused it: no service named web"},
		{DiffLeak, "k8s/prod", id(7), "no longer reports it"},
		{DiffMismatch, "k8s/prod", id(3), "zone az2 in the registry, az1 in k8s/prod"},
		{DiffHeld, "k8s/prod", id(6), "disbelief threshold holds"},
		{DiffLeak, "registered", id(100), "registration leak"},
	}
	if len(rows) != len(want) {
		t.Fatalf("diff has %d items, want %d: %+v", len(rows), len(want), rows)
	}
	for i, w := range want {
		r := rows[i]
		if r.Kind != w.kind || r.Source != w.source || r.Instance != w.id || !strings.Contains(r.Detail, w.detail) {
			t.Errorf("item %d = %+v, want %s %s %s ~%q", i, r, w.kind, w.source, w.id, w.detail)
		}
	}
}

// bigReading is n ready endpoints of 450 services and their live
// instances, the region's scale (60,000 instances).
func bigReading(n int) ([]Endpoint, []Live) {
	es := make([]Endpoint, n)
	ls := make([]Live, n)
	for i := range n {
		svc := fmt.Sprintf("svc-%d", i%450)
		addr := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
		es[i] = Endpoint{Service: svc, Key: fmt.Sprint(i), Address: addr, Port: 8080, Zone: "az1", Ready: true, Serving: true, ID: id(i)}
		ls[i] = Live{ID: id(i), Service: svc, Address: addr, Port: 8080, Zone: "az1"}
	}
	return es, ls
}

// BenchmarkDecide is one pass's pure work over a 60,000-instance source
// (100 pods rolled: 100 new, 100 gone).
func BenchmarkDecide(b *testing.B) {
	es, ls := bigReading(60_100)
	es, ls = es[100:], ls[:60_000]
	d := Disbelief{}
	_ = d.Validate()
	r := Reading{Endpoints: es}
	b.ResetTimer()
	for b.Loop() {
		p := Decide(d, r, ls, nil, Confirmation{}, t0)
		if len(p.Create) != 100 || len(p.End) != 100 {
			b.Fatalf("created %d, ended %d", len(p.Create), len(p.End))
		}
	}
}

// BenchmarkDecideConfirmedRelease is the pass that releases a confirmed
// hold of a 60,000-instance source that lost a quarter of itself (15,000
// absences, each checked against the confirmation's 15,000 instances).
func BenchmarkDecideConfirmedRelease(b *testing.B) {
	es, ls := bigReading(60_000)
	d := Disbelief{}
	_ = d.Validate()
	r := Reading{Endpoints: es[15_000:]}
	first := Decide(d, r, ls, nil, Confirmation{}, t0)
	if first.Hold == nil {
		b.Fatal("no hold")
	}
	c := Confirmation{At: t0, Instances: first.Held}
	b.ResetTimer()
	for b.Loop() {
		if p := Decide(d, r, ls, first.Hold, c, t0); len(p.End) != 15_000 {
			b.Fatalf("ended %d", len(p.End))
		}
	}
}

// BenchmarkDiffOf is the diff over a 60,000-instance source in step.
func BenchmarkDiffOf(b *testing.B) {
	es, ls := bigReading(60_000)
	reg := make([]Registered, len(ls))
	for i, l := range ls {
		reg[i] = Registered{Live: l, Source: "k8s/prod"}
	}
	views := []SourceView{{Name: "k8s/prod", Reading: Reading{Endpoints: es}}}
	b.ResetTimer()
	for b.Loop() {
		if items := DiffOf(views, reg); len(items) != 0 {
			b.Fatalf("%d items", len(items))
		}
	}
}

// TestDecideAfterCountsRecentAbsences: a source that drops a little of
// the fleet each pass is believed once (2 of 10, not above 20%), and the
// next pass's 1 more, alone always believed (under min_removals), counted
// with the 2 believed within the window (3 of the 10 there were) is held:
// lying a little at a time drains nothing.
func TestDecideAfterCountsRecentAbsences(t *testing.T) {
	d := Disbelief{}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	d.MinRemovals = 2
	p := DecideAfter(d, Reading{Endpoints: readyN(1, 8)}, live(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), nil, Confirmation{}, t0, nil)
	if p.Hold != nil || p.Believed["web"] != 2 || len(p.End) != 2 {
		t.Fatalf("first pass: hold %+v, believed %v, ended %d; want none, 2, 2", p.Hold, p.Believed, len(p.End))
	}
	next := Reading{Endpoints: readyN(1, 7)}
	// Alone, the next reading is believed, as Decide believes it.
	if alone := Decide(d, next, live(1, 2, 3, 4, 5, 6, 7, 8), nil, Confirmation{}, t0.Add(5*time.Second)); alone.Hold != nil || alone.Believed["web"] != 1 {
		t.Fatalf("the next reading alone: hold %+v, believed %v; want none, 1", alone.Hold, alone.Believed)
	}
	p = DecideAfter(d, next, live(1, 2, 3, 4, 5, 6, 7, 8), nil, Confirmation{}, t0.Add(5*time.Second), p.Believed)
	want := &Hold{Since: t0.Add(5 * time.Second), Had: 10, Lacking: 3, Services: []string{"web"}, Whole: true}
	if diff := cmp.Diff(want, p.Hold); diff != "" || len(p.End) != 0 || len(p.Believed) != 0 {
		t.Fatalf("after the first pass (-want +got hold):\n%s ended %d, believed %v", diff, len(p.End), p.Believed)
	}
	// A restarted pod (a new instance for an ended one) is a replacement,
	// not a loss: nothing counts against the next passes.
	restart := append(readyN(1, 9), ep(11, true, true, false))
	if p := Decide(d, Reading{Endpoints: restart}, live(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), nil, Confirmation{}, t0); len(p.Believed) != 0 || len(p.End) != 1 {
		t.Fatalf("a restart: believed %v, ended %d; want none, 1", p.Believed, len(p.End))
	}
}

// liveOf is live instances n… of service svc.
func liveOf(svc string, from, to int) ([]Live, []Endpoint) {
	var ls []Live
	var es []Endpoint
	for n := from; n <= to; n++ {
		e := ep(n, true, true, false)
		e.Service = svc
		es = append(es, e)
		ls = append(ls, Live{ID: e.ID, Service: svc, Address: e.Address, Port: e.Port, Zone: e.Zone})
	}
	return ls, es
}

// TestDecideHoldsAServiceDrainedWithinALargeSource: the threshold is
// checked per service too. A source of 1,000 api instances and 50 web
// instances whose reading lacks every web instance lacks under 5% of
// itself, and was believed: web was drained by one signal. Now web's
// absences are held (with the source's other, ordinary absences
// believed), and a hold that takes in a further service starts again, so
// a confirmation made before does not vouch for it.
func TestDecideHoldsAServiceDrainedWithinALargeSource(t *testing.T) {
	d := Disbelief{}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	web, _ := liveOf("web", 1, 50)
	api, apiEPs := liveOf("api", 100, 1099)
	all := append(append([]Live(nil), web...), api...)
	// Every web instance gone, and two api instances (ordinary churn).
	reading := Reading{Endpoints: apiEPs[2:]}
	p := Decide(d, reading, all, nil, Confirmation{}, t0)
	want := &Hold{Since: t0, Had: 50, Lacking: 50, Services: []string{"web"}, ByService: map[string]Count{"web": {Had: 50, Lacking: 50}}}
	if diff := cmp.Diff(want, p.Hold); diff != "" {
		t.Fatalf("hold (-want +got):\n%s", diff)
	}
	if len(p.Held) != 50 || len(p.End) != 2 || p.Believed["api"] != 2 || p.Believed["web"] != 0 {
		t.Fatalf("held %d, ended %d, believed %v; want 50 web held, 2 api ended and believed", len(p.Held), len(p.End), p.Believed)
	}
	// The whole source seen as before (the old threshold): under it.
	if lacking := 52; float64(lacking) > d.Fraction*float64(len(all)) {
		t.Fatalf("the case no longer tests a per-service drain: %d of %d is above %v", lacking, len(all), d.Fraction)
	}

	// Thirty seconds on, api loses 300 more: the hold takes api in and
	// starts again from now, not from web's start.
	later := t0.Add(30 * time.Second)
	p2 := DecideAfter(d, Reading{Endpoints: apiEPs[302:]}, append(append([]Live(nil), web...), api[2:]...), p.Hold, Confirmation{}, later, p.Believed)
	if p2.Hold == nil || !p2.Hold.Since.Equal(later) || len(p2.End) != 0 || len(p2.Held) != 350 {
		t.Fatalf("hold %+v, ended %d, held %d; want a hold of web and api since %s, nothing ended", p2.Hold, len(p2.End), len(p2.Held), later)
	}
	// The same an hour on: api's absences are new to the hold, nothing is
	// released, and the hold starts again.
	afterDwell := t0.Add(time.Hour)
	p4 := DecideAfter(d, Reading{Endpoints: apiEPs[302:]}, append(append([]Live(nil), web...), api[2:]...), p.Hold, Confirmation{}, afterDwell, p.Believed)
	if p4.Hold == nil || !p4.Hold.Since.Equal(afterDwell) || len(p4.End) != 0 || p4.Released != "" {
		t.Fatalf("an hour on: hold %+v, ended %d, released %q; want a new hold since %s, nothing ended", p4.Hold, len(p4.End), p4.Released, afterDwell)
	}
	// Web's absence alone, one more pass: its hold keeps its start.
	p3 := Decide(d, reading, all, p.Hold, Confirmation{}, t0.Add(time.Minute))
	if p3.Hold == nil || !p3.Hold.Since.Equal(t0) {
		t.Fatalf("hold %+v, want it to keep its start %s", p3.Hold, t0)
	}
}

// TestDecideLeavesInstancesNewerThanTheReading: a replica whose reading
// was taken before another replica made an instance (its informer lags)
// does not end that instance for its absence: ids are never reused, so
// the pod would stay invisible until it restarted. Once the reading is
// newer than the instance, its absence counts.
func TestDecideLeavesInstancesNewerThanTheReading(t *testing.T) {
	d := Disbelief{}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	ls := live(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	for i := range ls {
		ls[i].Since = t0.Add(-time.Hour)
	}
	ls[9].Since = t0.Add(time.Second) // made by the other replica after this reading
	r := Reading{Endpoints: readyN(1, 9), At: t0}
	p := Decide(d, r, ls, nil, Confirmation{}, t0.Add(2*time.Second))
	if len(p.End) != 0 || len(p.Held) != 0 || p.Hold != nil {
		t.Fatalf("ended %d, held %d: want instance 10 left alone", len(p.End), len(p.Held))
	}
	r.At = t0.Add(5 * time.Second)
	if p := Decide(d, r, ls, nil, Confirmation{}, t0.Add(6*time.Second)); len(p.End) != 1 || p.End[0] != id(10) {
		t.Fatalf("ended %v: want instance 10, its absence now news", p.End)
	}
}

// TestDecideReleasesOnlyTheConfirmedService: a confirmation releases the
// held absences of the services it vouches for, and nothing else. Web's
// team confirms web's five while api's three are held in the same source:
// web's end, api's stay held (the hold keeps its start), and web's count
// with the next readings for one window. Before, a confirmation of web
// released every absence of the source, api's included.
func TestDecideReleasesOnlyTheConfirmedService(t *testing.T) {
	d := Disbelief{}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	web, _ := liveOf("web", 1, 5)
	api, _ := liveOf("api", 100, 102)
	db, dbEPs := liveOf("db", 200, 239)
	all := append(append(append([]Live(nil), web...), api...), db...)
	webIDs, apiIDs := make([]uuid.UUID, len(web)), make([]uuid.UUID, len(api))
	for i, l := range web {
		webIDs[i] = l.ID
	}
	for i, l := range api {
		apiIDs[i] = l.ID
	}
	sortIDs(webIDs)
	sortIDs(apiIDs)

	for _, c := range []struct {
		name    string
		reading Reading
		live    []Live
		whole   bool
	}{
		// 8 of 48 lacking: under the source's threshold, each service over
		// its own.
		{"services held on their own", Reading{Endpoints: dbEPs}, all, false},
		// No endpoints at all: the source held as a whole.
		{"the source held as a whole", Reading{}, append(append([]Live(nil), web...), api...), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			all := c.live
			first := Decide(d, c.reading, all, nil, Confirmation{}, t0)
			if first.Hold == nil || first.Hold.Whole != c.whole || strings.Join(first.Hold.Services, ",") != "api,web" {
				t.Fatalf("first pass: hold %+v, want api and web held (whole %v)", first.Hold, c.whole)
			}
			heldBefore := len(first.Held)

			// Web's confirmation names web's five; api's names none.
			onlyWeb := Confirmation{At: t0.Add(time.Second), Instances: webIDs}
			p := Decide(d, c.reading, all, first.Hold, onlyWeb, t0.Add(2*time.Second))
			if diff := cmp.Diff(webIDs, p.End); diff != "" {
				t.Fatalf("ended (-want web's five +got):\n%s", diff)
			}
			if diff := cmp.Diff(apiIDs, p.Held); diff != "" {
				t.Fatalf("held (-want api's three +got):\n%s", diff)
			}
			if p.Hold == nil || strings.Join(p.Hold.Services, ",") != "api" || !p.Hold.Since.Equal(t0) || p.Released != "" ||
				strings.Join(p.Confirmed, ",") != "web" || p.Hold.Lacking != first.Hold.Lacking-5 || p.Hold.Had != first.Hold.Had-5 {
				t.Fatalf("hold %+v, released %q, confirmed %v; want api's hold going on since %s, web confirmed", p.Hold, p.Released, p.Confirmed, t0)
			}
			if _, ok := p.Hold.ByService["web"]; ok {
				t.Fatalf("the hold still counts web: %+v", p.Hold.ByService)
			}
			if p.Believed["web"] != 5 {
				t.Fatalf("believed %v; want web's five counted with the next readings", p.Believed)
			}

			// The next pass, web's instances ended: api is still held, with
			// the same start, and a confirmation of web counts for nothing
			// more.
			var rest []Live
			for _, l := range all {
				if l.Service != "web" {
					rest = append(rest, l)
				}
			}
			next := DecideAfter(d, c.reading, rest, p.Hold, onlyWeb, t0.Add(5*time.Second), p.Believed)
			if next.Hold == nil || strings.Join(next.Hold.Services, ",") != "api" || !next.Hold.Since.Equal(t0) || len(next.End) != 0 || next.Released != "" {
				t.Fatalf("next pass: hold %+v, ended %d, released %q; want api still held since %s", next.Hold, len(next.End), next.Released, t0)
			}
			// After the window too: nobody confirmed api.
			late := DecideAfter(d, c.reading, rest, next.Hold, onlyWeb, t0.Add(d.Window+time.Minute), nil)
			if late.Hold == nil || len(late.End) != 0 {
				t.Fatalf("after the window: hold %+v, ended %d; want api still held", late.Hold, len(late.End))
			}

			// A confirmation naming four of web's five releases nothing.
			some := Confirmation{At: t0.Add(time.Second), Instances: webIDs[:4]}
			if p := Decide(d, c.reading, all, first.Hold, some, t0.Add(2*time.Second)); len(p.End) != 0 || len(p.Held) != heldBefore || len(p.Confirmed) != 0 {
				t.Fatalf("four of five: ended %d, held %d, confirmed %v; want nothing released", len(p.End), len(p.Held), p.Confirmed)
			}

			// Web's team and api's each confirm their own before the same
			// pass: both are released, and the hold ends.
			both := VouchedSince([]Confirmation{onlyWeb, {At: t0.Add(1500 * time.Millisecond), Instances: apiIDs}}, first.Hold.Since)
			p = Decide(d, c.reading, all, first.Hold, both, t0.Add(2*time.Second))
			if p.Hold != nil || len(p.End) != 8 || !strings.HasPrefix(p.Released, "confirmed by an operator") || len(p.Believed) != 0 {
				t.Fatalf("both confirmed: hold %+v, ended %d, released %q, believed %v; want all 8 ended, no hold", p.Hold, len(p.End), p.Released, p.Believed)
			}
		})
	}
}

// TestVouchedSince: confirmations older than the hold vouch for nothing;
// the rest vouch together, as of the oldest.
func TestVouchedSince(t *testing.T) {
	old := Confirmation{At: t0.Add(-time.Second), Instances: ids(1)}
	a := Confirmation{At: t0.Add(2 * time.Second), Instances: ids(2)}
	b := Confirmation{At: t0, Instances: ids(3, 4)}
	got := VouchedSince([]Confirmation{a, old, b}, t0)
	if !got.At.Equal(t0) || !got.Covers(ids(2, 3, 4), t0) || got.Covers(ids(1), t0) {
		t.Fatalf("vouched %+v; want 2, 3 and 4 as of %s, not 1", got, t0)
	}
	if got := VouchedSince([]Confirmation{old}, t0); !got.At.IsZero() || got.Instances != nil {
		t.Fatalf("only an older confirmation: %+v, want none", got)
	}
	// A confirmation naming none vouches for none (the form before
	// confirmations named their instances).
	if got := VouchedSince([]Confirmation{{At: t0, Instances: []uuid.UUID{}}}, t0); got.Covers(ids(1), t0) {
		t.Fatalf("an empty confirmation vouches for %+v", got)
	}
}
