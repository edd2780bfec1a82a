package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// demoStories waits (polling with a deadline) until each of the demo's
// stories shows through the public API of d, a `muster dev --demo`
// whose estate is set up (TestDemo): the quarantined flapper, catalog's
// tripped guard in az2, notifications unknown (not drained) in az3, and
// a manual shift-back pending confirmation with its alarm.
func demoStories(t *testing.T, d *devServer, admin string) {
	t.Helper()
	// get decodes a 200 answer into out; a 404 (the demo has not created
	// the service yet) or a 503 (not ready) leaves out empty.
	get := func(path string, out any) {
		t.Helper()
		code, body := call(t, "GET", d.url+path, admin, "")
		if code == 404 || code == 503 {
			return
		}
		if code != 200 {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
	}
	type verdicts struct {
		Instances []struct {
			Zone, State string
			Health      string   `json:"health"`
			Reasons     []string `json:"reasons"`
		} `json:"instances"`
	}
	stories := map[string]func() bool{
		"flapping instance quarantined": func() bool {
			var v verdicts
			get("/v1/services/recommendations/eligibility", &v)
			for _, in := range v.Instances {
				if in.State == "ineligible" && strings.Contains(strings.Join(in.Reasons, ";"), "quarantined until") {
					return true
				}
			}
			return false
		},
		"catalog's az2 guard tripped": func() bool {
			var a struct {
				Alarms []struct{ Kind, Service, Zone string } `json:"alarms"`
			}
			get("/v1/alarms", &a)
			for _, al := range a.Alarms {
				if al.Kind == "fraction_guard" && al.Service == "catalog" && al.Zone == "az2" {
					return true
				}
			}
			return false
		},
		"notifications unknown in az3, still in rotation": func() bool {
			var v verdicts
			get("/v1/services/notifications/eligibility", &v)
			n := 0
			for _, in := range v.Instances {
				if in.Zone == "az3" && in.State == "unknown" {
					n++
				}
			}
			return n == 2
		},
		"shift-back pending confirmation, alarmed": func() bool {
			var a struct {
				Alarms []struct{ Kind string } `json:"alarms"`
			}
			get("/v1/alarms", &a)
			var s struct {
				Items []struct{ State, Target string } `json:"items"`
			}
			get("/v1/shifts?state=pending_confirmation", &s)
			for _, al := range a.Alarms {
				if al.Kind == "shiftback_pending" && len(s.Items) == 1 && s.Items[0].Target == "az3" {
					return true
				}
			}
			return false
		},
	}
	deadline := time.Now().Add(3 * time.Minute)
	seen := map[string]time.Duration{}
	start := time.Now()
	for len(seen) < len(stories) {
		for name, ok := range stories {
			if _, done := seen[name]; !done && ok() {
				seen[name] = time.Since(start).Round(time.Second)
			}
		}
		if time.Now().After(deadline) {
			var missing []string
			for name := range stories {
				if _, done := seen[name]; !done {
					missing = append(missing, name)
				}
			}
			t.Fatalf("after 3 min the demo has not shown: %v (seen: %v)\n%s", missing, seen, d.stderr.String())
		}
		time.Sleep(time.Second) // polling with a deadline
	}
	t.Log(fmt.Sprint("stories seen after: ", seen))
}
