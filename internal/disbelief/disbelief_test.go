package disbelief

import (
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
)

func TestRuleOver(t *testing.T) {
	r := Rule{Fraction: 0.2, MinMass: 3}
	for _, c := range []struct {
		had, lacking int
		want         bool
	}{
		{10, 2, false}, // under the mass
		{15, 3, false}, // 20% exactly is believed
		{10, 3, true},
		{0, 3, false},
		{2, 2, false}, // a whole small scope, under the mass
	} {
		if got := r.Over(c.had, c.lacking); got != c.want {
			t.Errorf("Over(%d, %d) = %v, want %v", c.had, c.lacking, got, c.want)
		}
	}
}

func TestParseScope(t *testing.T) {
	for in, want := range map[string]Scope{
		"region":          {Kind: Region},
		"zone az1":        {Kind: Zone, Name: "az1"},
		" service web ":   {Kind: Service, Name: "web"},
		"source k8s/prod": {Kind: Source, Name: "k8s/prod"},
		"prober p-1":      {Kind: Prober, Name: "p-1"},
	} {
		got, err := ParseScope(in)
		if err != nil || got != want || got.String() != want.String() {
			t.Errorf("ParseScope(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "zone", "region x", "galaxy far", "service ",
		// A scope names one thing: what follows the kind is one word.
		"service web api", "service web\tapi", "service web\napi", "service \x00web", "service w\u200beb",
		"service \xffweb", "zone " + strings.Repeat("a", 254), strings.Repeat("service ", 50),
		"service\tweb", "SERVICE web",
	} {
		if sc, err := ParseScope(bad); err == nil {
			t.Errorf("ParseScope(%q) = %+v, want an error", bad, sc)
		}
	}
}

func FuzzParseScope(f *testing.F) {
	for _, s := range []string{"region", "zone az1", "service web", "source k8s/a b", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sc, err := ParseScope(s)
		if err != nil {
			return
		}
		again, err := ParseScope(sc.String())
		if err != nil || again != sc {
			t.Fatalf("%q parsed as %+v, which reads back as %+v, %v", s, sc, again, err)
		}
		if strings.ContainsFunc(sc.Name, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }) || !utf8.ValidString(sc.Name) || len(sc.Name) > 253 {
			t.Fatalf("%q parsed as %+v: a name is one printable word", s, sc)
		}
	})
}

func TestConfirmationCovers(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	a, b := uuid.New(), uuid.New()
	for _, c := range []struct {
		name string
		c    Confirmation
		want bool
	}{
		{"none", Confirmation{}, false},
		{"before the hold", Confirmation{At: t0.Add(-time.Second), Instances: []uuid.UUID{a, b}}, false},
		{"names them all", Confirmation{At: t0, Instances: []uuid.UUID{a, b}}, true},
		{"names some", Confirmation{At: t0, Instances: []uuid.UUID{a}}, false},
		{"the whole scope", Confirmation{At: t0}, true},
	} {
		if got := c.c.Covers([]uuid.UUID{a, b}, t0); got != c.want {
			t.Errorf("%s: Covers = %v, want %v", c.name, got, c.want)
		}
	}
}
