package stream

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

func view(service string, v uint64) *Frame {
	return &Frame{Kind: KindView, Service: service, Version: v, JSON: fmt.Appendf(nil, `{"service":%q,"version":%d}`, service, v)}
}

func delta(service string, from, v uint64) *Frame {
	return &Frame{Kind: KindDelta, Service: service, FromVersion: from, Version: v, JSON: fmt.Appendf(nil, `{"from_version":%d,"version":%d}`, from, v)}
}

func versions(fs []*Frame) []string {
	var out []string
	for _, f := range fs {
		out = append(out, fmt.Sprintf("%s:%s@%d", f.Service, f.Kind, f.Version))
	}
	return out
}

func TestCatchUp(t *testing.T) {
	h := NewHub(Config{History: 3})
	h.Publish([]Update{{View: view("web", 1)}, {View: view("api", 2)}})
	h.Publish([]Update{{View: view("web", 3), Delta: delta("web", 1, 3)}})
	h.Publish([]Update{{View: view("web", 4), Delta: delta("web", 3, 4)}})
	for _, tc := range []struct {
		since uint64
		want  string
	}{
		{0, "[api:view@2 web:view@4 :synced@0]"}, // new client: full views
		{1, "[api:view@2 web:delta@3 web:delta@4 :synced@0]"},
		{3, "[web:delta@4 :synced@0]"}, // api current at 2 <= 3
		{4, "[:synced@0]"},             // current
	} {
		sub, err := h.Subscribe([]string{"web", "api"}, tc.since)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(versionsOrEmpty(sub.Initial)); got != tc.want {
			t.Errorf("since %d: %s, want %s", tc.since, got, tc.want)
		}
		sub.Close()
	}
	// History of 3 no longer reaches version 1 after three more deltas.
	for v := uint64(5); v <= 7; v++ {
		h.Publish([]Update{{View: view("web", v), Delta: delta("web", v-1, v)}})
	}
	sub, _ := h.Subscribe([]string{"web"}, 1)
	if got := fmt.Sprint(versionsOrEmpty(sub.Initial)); got != "[web:view@7 :synced@0]" {
		t.Errorf("too old: %s, want a full view", got)
	}
	// An older version never replaces a newer one.
	h.Publish([]Update{{View: view("web", 6)}})
	if f, _ := h.View("web"); f.Version != 7 {
		t.Errorf("view went back to %d", f.Version)
	}
}

func versionsOrEmpty(fs []*Frame) []string {
	if v := versions(fs); v != nil {
		return v
	}
	return []string{}
}

func TestSlowSubscriberIsResynced(t *testing.T) {
	h := NewHub(Config{QueueLen: 2})
	h.Publish([]Update{{View: view("web", 1)}})
	sub, _ := h.Subscribe([]string{"web"}, 1)
	for v := uint64(2); v <= 10; v++ {
		h.Publish([]Update{{View: view("web", v), Delta: delta("web", v-1, v)}})
	}
	if n := len(sub.C()); n != 0 {
		t.Fatalf("an overflowed queue keeps %d frames", n)
	}
	select {
	case <-sub.Resync():
	default:
		t.Fatal("no resync signal")
	}
	if got := versions(sub.TakeResync()); fmt.Sprint(got) != "[web:view@10]" {
		t.Fatalf("resync frames %v", got)
	}
	h.Publish([]Update{{View: view("web", 11), Delta: delta("web", 10, 11)}})
	if f := <-sub.C(); f.Version != 11 {
		t.Fatalf("after resync got %d", f.Version)
	}
	sub.Close()
	if n, peak := h.Subscribers(); n != 0 || peak != 1 {
		t.Fatalf("subscribers %d peak %d", n, peak)
	}
}

func TestCloseDrainsSubscribers(t *testing.T) {
	h := NewHub(Config{})
	sub, _ := h.Subscribe([]string{"web", "api"}, 0)
	h.Close()
	f := <-sub.C()
	if f.Kind != KindDrain {
		t.Fatalf("got %s, want drain", f.Kind)
	}
	var d Drain
	if err := json.Unmarshal(f.JSON, &d); err != nil || d.Reason != DrainShutdown || d.ReconnectWithinMS != DefaultDrainSpread.Milliseconds() {
		t.Fatalf("drain %s (%v), want the shutdown reason and a %s window", f.JSON, err, DefaultDrainSpread)
	}
	if len(sub.C()) != 0 {
		t.Fatal("drain sent twice to one subscriber")
	}
	if _, err := h.Subscribe([]string{"web"}, 0); err != ErrClosed {
		t.Fatalf("subscribe after close: %v", err)
	}
}

// TestAdmissionRefusesTheSixthPercent: with a recent peak of 10,000
// subscribers, a storm in which all of them reconnect at once is admitted
// 5% per window: five 1% slices get in, the sixth is refused with a
// Retry-After that spreads it over later windows.
func TestAdmissionRefusesTheSixthPercent(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	a := NewAdmission(AdmissionConfig{Now: func() time.Time { return now }, Rand: func() float64 { return 0.5 }})
	a.Admit(10000) // the population before the storm sets the peak
	now = now.Add(10 * time.Second)
	for slice := 1; slice <= 6; slice++ {
		admitted := 0
		var retry time.Duration
		for range 100 { // 1% of 10,000
			ok, ra := a.Admit(0)
			if ok {
				admitted++
			} else {
				retry = ra
			}
		}
		switch {
		case slice <= 5 && admitted != 100:
			t.Fatalf("slice %d: %d of 100 admitted", slice, admitted)
		case slice == 6 && admitted != 0:
			t.Fatalf("sixth slice: %d admitted, want 0", admitted)
		case slice == 6 && (retry < 10*time.Second || retry > 210*time.Second):
			// The next slot frees in 10 s; the 9,500 not yet back need 19
			// more windows at 500 each, and Rand 0.5 lands mid-way.
			t.Fatalf("Retry-After %s, want within the windows the backlog needs", retry)
		}
	}
	if a.Refused() != 100 {
		t.Fatalf("refused %d", a.Refused())
	}
	// The next window admits again.
	now = now.Add(10 * time.Second)
	if ok, _ := a.Admit(500); !ok {
		t.Fatal("the next window refused")
	}
}

func TestAdmissionFloorForSmallEstates(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	a := NewAdmission(AdmissionConfig{Now: func() time.Time { return now }, Floor: 20})
	for i := range 20 {
		if ok, _ := a.Admit(i); !ok {
			t.Fatalf("subscriber %d of a small estate refused", i)
		}
	}
	if ok, _ := a.Admit(20); ok {
		t.Fatal("the 21st in one window admitted past the floor")
	}
}

// TestCatchUpAfterARestartNeverSendsADeltaFromAnotherBase (issue 27): a
// restarted process restores web's last saved view (10), which may be
// older than the last one published before the crash (say 15: saves are
// asynchronous), and publishes 20 as a delta from 10. A client at exactly
// 10 can use the delta; a client whose watermark is above 10 may hold 15
// and gets the full view, never the delta from 10. Later deltas chain
// from versions this hub published and are used as before.
func TestCatchUpAfterARestartNeverSendsADeltaFromAnotherBase(t *testing.T) {
	h := NewHub(Config{History: 8})
	h.Publish([]Update{{View: view("web", 20), Delta: delta("web", 10, 20)}})
	h.Publish([]Update{{View: view("web", 30), Delta: delta("web", 20, 30)}})
	for _, tc := range []struct {
		since uint64
		want  string
	}{
		{10, "[web:delta@20 web:delta@30 :synced@0]"}, // exactly the restored base
		{15, "[web:view@30 :synced@0]"},               // may hold a lost 15
		{5, "[web:view@30 :synced@0]"},
		{20, "[web:delta@30 :synced@0]"}, // this hub's own chain
		{25, "[web:delta@30 :synced@0]"},
		{30, "[:synced@0]"},
	} {
		sub, err := h.Subscribe([]string{"web"}, tc.since)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(versionsOrEmpty(sub.Initial)); got != tc.want {
			t.Errorf("since %d: %s, want %s", tc.since, got, tc.want)
		}
		sub.Close()
	}
}
