package webui_test

import (
	"fmt"
	"net/http"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/musterhq/muster/internal/registry"
)

// TestAuditPageServiceFilter: the service filter finds the events aimed at
// the service and at its instances, not another service's, and its pages
// keep the filter.
func TestAuditPageServiceFilter(t *testing.T) {
	t.Parallel()
	st := newUIStack(t)
	st.Seed(t)
	var last registry.Instance
	for i := range 51 {
		in, err := st.Registry.Register(t.Context(), uiAdmin, netip.Addr{}, "web", registry.Registration{
			Address: fmt.Sprintf("10.8.0.%d", i+1), Port: 8080, Zone: "az1"})
		if err != nil {
			t.Fatal(err)
		}
		last = in
	}
	if _, err := st.Registry.Register(t.Context(), uiAdmin, netip.Addr{}, "api", registry.Registration{
		Address: "10.8.1.1", Port: 9090, Zone: "az1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Registry.Deregister(t.Context(), uiAdmin, last.ID); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, st)
	b.signIn("vera")

	p := b.get("/ui/audit?service=web")
	if p.status != http.StatusOK || !strings.Contains(p.body, `name="service" value="web"`) {
		t.Fatalf("service filter: %d\n%s", p.status, p.body)
	}
	if !strings.Contains(p.body, "<td>instance.deregister</td>") || !strings.Contains(p.body, "instance "+last.ID.String()) {
		t.Error("the filter misses the event aimed at one of web's instances")
	}
	if strings.Contains(p.body, "<td>service api</td>") || strings.Contains(p.body, "ui.sign_in") {
		t.Error("the filter shows events of another service or of no service")
	}
	if n := strings.Count(p.body, "<tr data-seq="); n != 50 {
		t.Errorf("first page has %d events, want 50", n)
	}
	m := regexp.MustCompile(`id="older" href="([^"]+)"`).FindStringSubmatch(p.body)
	if m == nil || !strings.Contains(m[1], "service=web") {
		t.Fatalf("the older page link does not keep the filter: %v", m)
	}
	older := b.get(strings.ReplaceAll(m[1], "&amp;", "&"))
	// 51 registrations, 1 deregistration with the record of its end
	// (end.record), and web's own PUT by Seed: 54.
	if n := strings.Count(older.body, "<tr data-seq="); n != 4 || strings.Contains(older.body, "<td>service api</td>") {
		t.Errorf("older page has %d events, want 4 of web's:\n%s", n, older.body)
	}
	if p := b.get("/ui/audit?service=Not%20A%20Name"); p.status != http.StatusBadRequest {
		t.Errorf("a bad service name: %d", p.status)
	}
}
