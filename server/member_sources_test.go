package server_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/registry"
)

// TestMemberSourcesAPI: GET and PUT /v1/services/{name}/member-sources
// over real HTTP. The owning team's operator writes them (version 1,
// audited); a viewer of the team, an operator of another team and a
// workload of the service are refused 403 and audited; a body that does
// not decode is 400 problem+json, one that breaks a rule (even in one
// entry of several) 422 with the field named; nothing of a refused write
// is stored.
func TestMemberSourcesAPI(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{})
	s.Seed(t)
	get := func() registry.MemberSources {
		t.Helper()
		r := s.Do(t, "GET", "/v1/services/web/member-sources", s.Token(t, oscarReq), "", "")
		if r.Status != http.StatusOK {
			t.Fatalf("get: %d %s", r.Status, r.Body)
		}
		return apptest.Decode[registry.MemberSources](t, r)
	}
	put := func(req any, body string) apptest.Response {
		t.Helper()
		var tok string
		switch q := req.(type) {
		case string:
			tok = q
		default:
			tok = s.Token(t, oscarReq)
		}
		return s.JSON(t, "PUT", "/v1/services/web/member-sources", tok, body)
	}
	if m := get(); m.Configured || m.Version != 0 || len(m.Sources) != 0 {
		t.Fatalf("before any write: %+v", m)
	}

	const good = `{"sources":[{"source":"k8s/prod","namespaces":["shop"]},{"source":"k8s/prod","selector":"team=payments"},{"source":"snapshot/ec2-batch"}]}`
	r := put(nil, good)
	if r.Status != http.StatusOK {
		t.Fatalf("owner's put: %d %s", r.Status, r.Body)
	}
	want := []registry.MemberSource{
		{Source: "k8s/prod", Namespaces: []string{"shop"}},
		{Source: "k8s/prod", Selector: "team=payments"},
		{Source: "snapshot/ec2-batch"},
	}
	stored := get()
	if !stored.Configured || stored.Version != 1 || stored.UpdatedBy == "" {
		t.Fatalf("after the owner's put: %+v", stored)
	}
	if d := cmp.Diff(want, stored.Sources); d != "" {
		t.Fatalf("stored sources (-want +got):\n%s", d)
	}

	// Refused callers: 403, audited, nothing changed.
	const widen = `{"sources":[{"source":"k8s/prod","namespaces":["attacker"]}]}`
	for name, tok := range map[string]string{
		"viewer of payments":    s.Token(t, veraReq),
		"operator of search":    s.Token(t, samReq),
		"web's own workload":    s.Token(t, webReq),
		"another service's one": s.Token(t, apiReq),
	} {
		if r := put(tok, widen); r.Status != http.StatusForbidden {
			t.Errorf("%s: %d %s, want 403", name, r.Status, r.Body)
		} else {
			wantProblem(t, r, http.StatusForbidden, "forbidden")
		}
	}
	refused, err := audit.List(context.Background(), db.New(s.Pool), audit.Filter{Action: "member_sources.put", Outcome: audit.Refused, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(refused) != 4 {
		t.Errorf("refused member_sources.put audited: %d, want 4", len(refused))
	}
	accepted, err := audit.List(context.Background(), db.New(s.Pool), audit.Filter{Action: "member_sources.put", Outcome: audit.Accepted, Limit: 100})
	if err != nil || len(accepted) != 1 || accepted[0].Target != "web" {
		t.Errorf("accepted member_sources.put audited: %+v %v", accepted, err)
	}

	// Bad bodies: 400 problem+json (does not decode), 422 (breaks a rule);
	// one bad entry among good ones stores nothing of them.
	for _, c := range []struct {
		body   string
		status int
		slug   string
		field  string
	}{
		{`{"sources":[`, http.StatusBadRequest, "malformed-json", ""},
		{`{"sources":[{"source":"k8s/prod","namespaces":["shop"],"cluster_wide":true}]}`, http.StatusBadRequest, "unknown-field", ""},
		{`{"sources":"k8s/prod"}`, http.StatusBadRequest, "malformed-json", ""},
		{`{}`, http.StatusUnprocessableEntity, "validation", "sources"},
		{`{"sources":[{"source":"k8s/prod"}]}`, http.StatusUnprocessableEntity, "validation", "sources[0]"},
		{`{"sources":[{"source":"k8s/prod","namespaces":["shop"]},{"source":"k8s/prod","namespaces":["Not_A_Namespace"]}]}`, http.StatusUnprocessableEntity, "validation", "sources[1].namespaces[0]"},
		{`{"sources":[{"source":"k8s/prod","selector":"tier in ("}]}`, http.StatusUnprocessableEntity, "validation", "sources[0].selector"},
		{`{"sources":[{"source":"snapshot/ec2","namespaces":["shop"]}]}`, http.StatusUnprocessableEntity, "validation", "sources[0]"},
		{`{"sources":[{"source":"consul/dc1"}]}`, http.StatusUnprocessableEntity, "validation", "sources[0].source"},
	} {
		r := put(nil, c.body)
		m := wantProblem(t, r, c.status, c.slug)
		if c.field != "" {
			errs, _ := m["errors"].([]any)
			found := false
			for _, e := range errs {
				if f, _ := e.(map[string]any); f != nil && f["field"] == c.field {
					found = true
				}
			}
			if !found {
				t.Errorf("%s: errors %v do not name %s", c.body, m["errors"], c.field)
			}
		}
		if got := get(); got.Version != 1 || !cmp.Equal(got.Sources, want) {
			t.Fatalf("after the refused %s: %+v", c.body, got)
		}
	}

	// An admin may write them; an empty list is a choice (no source).
	if r := put(s.Token(t, adminReq), `{"sources":[]}`); r.Status != http.StatusOK {
		t.Fatalf("admin's put: %d %s", r.Status, r.Body)
	}
	if got := get(); !got.Configured || got.Version != 2 || len(got.Sources) != 0 {
		t.Fatalf("after the admin's empty put: %+v", got)
	}
	// No such service.
	if r := s.JSON(t, "PUT", "/v1/services/nope/member-sources", s.Token(t, adminReq), good); r.Status != http.StatusNotFound {
		t.Errorf("put on an unknown service: %d %s", r.Status, r.Body)
	}
}
