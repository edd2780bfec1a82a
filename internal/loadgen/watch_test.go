package loadgen

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/cli"
)

// TestLoadgenWatchClientAppliesFrames feeds one subscriber a view longer
// than its read buffer and then deltas, and checks that the copy follows
// and that injected changes are sampled once each.
func TestLoadgenWatchClientAppliesFrames(t *testing.T) {
	svc := &lgwService{name: "lg-0000", index: map[uuid.UUID]int32{}, watchers: 1}
	w := &lgWatch{servicesByName: map[string]*lgwService{svc.name: svc}, services: []*lgwService{svc}}
	c := &lgwClient{w: w, copies: []*lgwCopy{{svc: svc}}}

	var eps []assembler.Endpoint
	for i := range 100 { // ~15 KB of JSON: several buffer-fulls
		eps = append(eps, assembler.Endpoint{InstanceID: uuid.New(), Address: fmt.Sprintf("10.0.0.%d", i), Port: 8080, Zone: "az1", State: "eligible", Weight: 1})
	}
	failed, added := eps[7].InstanceID, uuid.New()
	frame := func(event string, v any) string {
		b, _ := json.Marshal(v)
		var version uint64
		switch x := v.(type) {
		case assembler.View:
			version = x.Version
		case assembler.Delta:
			version = x.Version
		}
		return fmt.Sprintf("event: %s\nid: %d\ndata: %s\n\n", event, version, b)
	}
	at := time.Now().Add(-time.Second)
	fail := &lgwInjection{n: 0, id: failed, idx: svc.intern(failed), svc: svc, at: at}
	add := &lgwInjection{n: 1, id: added, idx: svc.intern(added), svc: svc, addition: true, at: at}
	w.addInjection(fail)
	w.addInjection(add)

	stream := frame("view", assembler.View{Service: svc.name, Version: 10, Endpoints: eps}) +
		"event: heartbeat\ndata: {}\n\n" +
		frame("delta", assembler.Delta{Service: svc.name, FromVersion: 10, Version: 11, Removals: []uuid.UUID{failed}}) +
		frame("delta", assembler.Delta{Service: svc.name, FromVersion: 11, Version: 12, Upserts: []assembler.Endpoint{{InstanceID: added, State: "eligible"}}}) +
		frame("delta", assembler.Delta{Service: svc.name, FromVersion: 12, Version: 13, Upserts: []assembler.Endpoint{{InstanceID: eps[9].InstanceID, State: "degraded"}}}) +
		"event: drain\ndata: {}\n\n"
	if !c.read(strings.NewReader(stream)) {
		t.Fatal("the drain frame did not end the stream")
	}
	if w.held.Load() != 1 || c.since != 13 || w.gaps.Load() != 0 || w.parseErrors.Load() != 0 {
		t.Fatalf("held %d since %d gaps %d parse errors %d", w.held.Load(), c.since, w.gaps.Load(), w.parseErrors.Load())
	}
	if len(w.withdrawLags) != 1 || len(w.additionLags) != 1 || w.withdrawLags[0] < time.Second {
		t.Fatalf("withdrawal lags %v, addition lags %v", w.withdrawLags, w.additionLags)
	}
	cp := c.copies[0]
	if bit(cp.present, fail.idx) || !bit(cp.present, add.idx) || !bit(cp.present, svc.intern(eps[0].InstanceID)) {
		t.Fatal("the copy does not follow the frames")
	}
	if v, d, h := w.frameViews.Load(), w.frameDeltas.Load(), w.frameBeats.Load(); v != 1 || d != 3 || h != 1 {
		t.Fatalf("frames: %d views %d deltas %d heartbeats", v, d, h)
	}
}

// TestLoadgenWatchBurstTargets checks that the burst fails no more than a
// third of any zone, and never enough to trip its guard.
func TestLoadgenWatchBurstTargets(t *testing.T) {
	svc := &lgwService{name: "lg-0000", index: map[uuid.UUID]int32{}, watchers: 1}
	ids := func(n int) []uuid.UUID {
		out := make([]uuid.UUID, n)
		for i := range out {
			out[i] = uuid.New()
		}
		return out
	}
	w := &lgWatch{zones: []*lgwZone{
		{svc: svc, name: "az1", total: 45, eligible: 45, minFraction: 0.5, targets: ids(45)}, // a third: 15
		{svc: svc, name: "az2", total: 44, eligible: 44, minFraction: 0.5, targets: ids(44)}, // 14
		{svc: svc, name: "az3", total: 40, eligible: 22, minFraction: 0.5, targets: ids(22)}, // guard: 22-k > 20, so 1
		{svc: svc, name: "az4", total: 2, eligible: 2, minFraction: 0.5, targets: ids(2)},    // 0
	}}
	rng := rand.New(rand.NewPCG(1, 2))
	all, headroom := w.burstTargets(rng, 1000)
	if headroom != 30 || len(all) != 30 {
		t.Fatalf("headroom %d, %d targets; want 30", headroom, len(all))
	}
	per := map[string]int{}
	seen := map[uuid.UUID]bool{}
	for _, x := range all {
		per[x.z.name]++
		if seen[x.id] {
			t.Fatalf("instance %s chosen twice", x.id)
		}
		seen[x.id] = true
	}
	if per["az1"] != 15 || per["az2"] != 14 || per["az3"] != 1 || per["az4"] != 0 {
		t.Fatalf("per zone %v", per)
	}
	if some, headroom := w.burstTargets(rng, 10); len(some) != 10 || headroom != 30 {
		t.Fatalf("%d targets of headroom %d; want 10 of 30", len(some), headroom)
	}
}

// TestLoadgenWatchReplicasFlag: --replicas takes a list of base URLs
// (trailing slashes trimmed, one URL may come twice) and makes the first
// the base; it is refused with --url, with --restart, and with anything
// that is not an http(s) base URL.
func TestLoadgenWatchReplicasFlag(t *testing.T) {
	o, err := parseLoadgenWatch([]string{"--replicas", "http://a:1/, http://b:2,http://a:1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"http://a:1", "http://b:2", "http://a:1"}; !slices.Equal(o.replicas, want) || o.base != "http://a:1" {
		t.Fatalf("replicas %q base %q, want %q based at the first", o.replicas, o.base, want)
	}
	if o, err := parseLoadgenWatch([]string{"--url", "http://a:1"}, io.Discard); err != nil || o.replicas != nil {
		t.Fatalf("without --replicas: %v, replicas %q", err, o.replicas)
	}
	for _, args := range [][]string{
		{"--replicas", "http://a:1", "--url", "http://b:2"},
		{"--replicas", "http://a:1", "--restart"},
		{"--replicas", "http://a:1,,http://b:2"},
		{"--replicas", "a:1"},
	} {
		if _, err := parseLoadgenWatch(args, io.Discard); !errors.Is(err, cli.ErrUsage) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}
