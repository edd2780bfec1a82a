package server

import (
	"slices"
	"strings"
	"testing"
)

// FuzzParseHeld: the held parameters of a watch come from any caller. They
// are taken only as pairs of a service the watch names and a version above
// 0, at most one per service; anything else is a 400, never a panic.
func FuzzParseHeld(f *testing.F) {
	for _, s := range []string{"web:1", "web:18446744073709551615", "web:0", "web:", ":1", "web", "api:2\x00web:3", "web:1\x00web:2", "web:-1", "web:1:2"} {
		f.Add(s)
	}
	services := []string{"api", "web"}
	f.Fuzz(func(t *testing.T, in string) {
		values := strings.Split(in, "\x00")
		held, p := parseHeld(values, services)
		if p != nil {
			if p.Status != 400 || held != nil {
				t.Fatalf("%q: %d %v", in, p.Status, held)
			}
			return
		}
		if len(held) != len(values) {
			t.Fatalf("%q: %d of %d values taken", in, len(held), len(values))
		}
		for name, v := range held {
			if !slices.Contains(services, name) || v == 0 {
				t.Fatalf("%q: took %s:%d", in, name, v)
			}
		}
	})
}
