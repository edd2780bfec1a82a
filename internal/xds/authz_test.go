package xds_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/internal/xds/xdstest"
)

// TestAGrantRowDeletedByHandKeepsRouting (issue 25): a grpc-go client
// dialling xds:///web as a workload of api, granted through muster, keeps
// routing after web's grant row is deleted by hand and the copy reloads:
// a missing row is not a revocation. The reload is held and alarmed, and
// the stream still follows web's changes. Revoking through muster (a
// sealed tombstone) still takes web away from api.
func TestAGrantRowDeletedByHandKeepsRouting(t *testing.T) {
	t.Parallel()
	e := newEstate(t, apptest.Options{}, map[string][]string{"az1": {"a1", "a2"}})
	e.grant()
	conn := xdstest.Dial(t, e.XDSAddr, e.Token(t, apptest.API), "web")
	only(t, conn, 30*time.Second, 40, "a1", "a2")

	if _, err := e.Pool.Exec(t.Context(), `DELETE FROM service_grants WHERE service = 'web'`); err != nil {
		t.Fatal(err)
	}
	if err := e.Authz.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	kinds := alarmKinds(t, e.Stack)
	if !slices.Contains(kinds, registry.AlarmAuthzReloadHeld) || !slices.Contains(kinds, registry.AlarmAuthzRowMissing) {
		t.Fatalf("alarms %v, want %s and %s", kinds, registry.AlarmAuthzReloadHeld, registry.AlarmAuthzRowMissing)
	}
	// Still routed, and still following web: a2 failing leaves a1 alone.
	only(t, conn, 10*time.Second, 40, "a1", "a2")
	e.report("hard_failure", "a2")
	e.Evaluator.EvaluateNow()
	e.Publisher.RunOnce()
	only(t, conn, 10*time.Second, 20, "a1")

	// Revoked through muster: the tombstone is sealed, and api loses web.
	if _, err := e.Registry.PutGrants(t.Context(), admin, "web", nil); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "api's calls to web failing after the revocation", func() bool {
		_, err := xdstest.Call(t.Context(), conn)
		return err != nil
	})
	var revokedAt *time.Time
	var seal []byte
	if err := e.Pool.QueryRow(t.Context(), `SELECT revoked_at, seal FROM service_grants WHERE service = 'web' AND caller = 'api'`).Scan(&revokedAt, &seal); err != nil {
		t.Fatalf("the revocation's tombstone: %v", err)
	}
	if revokedAt == nil || len(seal) == 0 {
		t.Fatalf("tombstone revoked_at %v, seal %x", revokedAt, seal)
	}
	if slices.Contains(alarmKinds(t, e.Stack), registry.AlarmAuthzRowMissing) {
		t.Fatalf("a revoked grant is still listed missing: %v", alarmKinds(t, e.Stack))
	}
}

func alarmKinds(t *testing.T, s *apptest.Stack) []string {
	t.Helper()
	var out []string
	for _, a := range s.Server.Alarms() {
		out = append(out, a.Kind)
		if strings.HasPrefix(a.Kind, "authz_") || strings.HasSuffix(a.Kind, "_unsealed") {
			t.Logf("alarm %s %s: %s", a.Kind, a.Service, a.Detail)
		}
	}
	return out
}
