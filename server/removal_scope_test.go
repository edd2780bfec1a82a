package server

import (
	"errors"
	"strings"
	"testing"

	"github.com/musterhq/muster/internal/disbelief"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/registry"
)

// TestReconcileScope: a confirmation of a reconciliation source's held
// removals names the source (or nothing: the source as a whole) or one
// service of it; anything else is refused as invalid, naming the scope
// field, before anything is read or written.
func TestReconcileScope(t *testing.T) {
	const source = "snapshot/fleet"
	whole := disbelief.Scope{Kind: disbelief.Source, Name: source}
	for _, c := range []struct {
		in   string
		want disbelief.Scope
		err  string
	}{
		{in: "", want: whole},
		{in: "   ", want: whole},
		{in: "source snapshot/fleet", want: whole},
		{in: " service web ", want: disbelief.Scope{Kind: disbelief.Service, Name: "web"}},
		{in: "service api-2", want: disbelief.Scope{Kind: disbelief.Service, Name: "api-2"}},
		{in: "source snapshot/other", err: "another source"},
		{in: "source k8s/prod", err: "another source"},
		{in: "service", err: "needs a name"},
		{in: "service web api", err: "not one word"},
		{in: "service web\tapi", err: "not one word"},
		{in: "service Web", err: "not a service name"},
		{in: "service -web", err: "not a service name"},
		{in: "service " + strings.Repeat("a", 64), err: "not a service name"},
		{in: "service \xffweb", err: "not UTF-8"},
		{in: "zone az1", err: "not in a zone"},
		{in: "region", err: "not in a region"},
		{in: "prober p1", err: "not in a prober"},
		{in: "galaxy far", err: "not a scope kind"},
		{in: strings.Repeat("x", 400), err: "at most"},
	} {
		got, err := reconcileScope(source, c.in)
		if c.err == "" {
			if err != nil || got != c.want {
				t.Errorf("reconcileScope(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
			}
			continue
		}
		var re *refusal.Error
		if !errors.As(err, &re) || re.Kind != refusal.Invalid || len(re.Fields) != 1 || re.Fields[0].Field != "scope" || !strings.Contains(re.Fields[0].Message, c.err) {
			t.Errorf("reconcileScope(%q) = %+v, %v; want an invalid scope saying %q", c.in, got, err, c.err)
		}
	}
}

// FuzzReconcileScope: whatever the text, reconcileScope never panics, and
// what it accepts is the source itself or one validly named service.
func FuzzReconcileScope(f *testing.F) {
	for _, s := range []string{"", "source snapshot/fleet", "service web", "service web api", "zone az1", "service \x00", "source  snapshot/fleet"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sc, err := reconcileScope("snapshot/fleet", s)
		if err != nil {
			var re *refusal.Error
			if !errors.As(err, &re) || re.Kind != refusal.Invalid {
				t.Fatalf("reconcileScope(%q): %v is not an invalid-input refusal", s, err)
			}
			return
		}
		switch {
		case sc == disbelief.Scope{Kind: disbelief.Source, Name: "snapshot/fleet"}:
		case sc.Kind == disbelief.Service && registry.ValidName(sc.Name):
		default:
			t.Fatalf("reconcileScope(%q) = %+v: neither the source nor a service", s, sc)
		}
	})
}
