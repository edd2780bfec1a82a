package app_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/app"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/seal"
)

// TestKeyWatchRaisesSealKeyMismatch (issue 25): a running replica that
// finds the live rows re-sealed by a key it was not given (muster seal
// rotate run before every replica trusted the new key) keeps routing what
// it verified and raises seal_key_mismatch, naming the key; trusted the
// new key, a replica counts no mismatch.
func TestKeyWatchRaisesSealKeyMismatch(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{})
	s.Seed(t)
	ctx := context.Background()
	for _, addr := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		r := s.JSON(t, "POST", "/v1/services/web/instances", s.Token(t, apptest.Admin), `{"address":"`+addr+`","port":8080,"zone":"az1"}`)
		if r.Status != http.StatusCreated {
			t.Fatalf("register: %d %s", r.Status, r.Body)
		}
	}
	s.SyncNow(t)
	routed := func() int {
		t.Helper()
		snap, ok := s.Evaluator.Snapshot("web")
		if !ok {
			t.Fatal("no snapshot of web")
		}
		return len(snap.Instances)
	}
	if n := routed(); n != 3 {
		t.Fatalf("%d instances of web, want 3", n)
	}
	if err := s.App.KeyWatch.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if a := s.App.KeyWatch.Alarms(); len(a) != 0 {
		t.Fatalf("alarms before the rotation: %+v", a)
	}

	// Re-sealed under a key this replica does not trust.
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	newKey := audit.NewKeySigner(priv)
	trusted := seal.Keys{}.With(apptest.SealKey()).With(newKey)
	if err := db.WithTx(ctx, s.Pool, func(q *db.Queries) error {
		b, err := registry.ResealInstances(ctx, q, newKey, trusted, uuid.Nil, 100)
		if err == nil && b.Resealed != 3 {
			t.Errorf("re-sealed %d instances, want 3", b.Resealed)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.App.KeyWatch.Check(ctx); err != nil {
		t.Fatal(err)
	}
	alarms := s.App.KeyWatch.Alarms()
	if len(alarms) != 1 || alarms[0].Kind != app.AlarmSealKeyMismatch || !strings.Contains(alarms[0].Detail, newKey.KeyID()) {
		t.Fatalf("alarms after the rotation: %+v", alarms)
	}
	// The instances are untrusted; the services (sealed too) are not.
	if untrusted, sealed := s.App.KeyWatch.Counts(); untrusted != 3 || sealed <= 3 {
		t.Fatalf("counted %d untrusted of %d", untrusted, sealed)
	}
	r := s.Do(t, "GET", "/v1/alarms", s.Token(t, apptest.Admin), "", "")
	if !strings.Contains(string(r.Body), app.AlarmSealKeyMismatch) {
		t.Fatalf("GET /v1/alarms does not list seal_key_mismatch: %s", r.Body)
	}
	// It keeps what it verified.
	s.SyncNow(t)
	if n := routed(); n != 3 {
		t.Fatalf("%d instances of web after the rotation, want 3 kept", n)
	}

	// A replica trusting the new key sees no mismatch.
	b := apptest.New(t, apptest.Options{Pool: s.Pool, Policy: func(pc *policy.Config) { pc.SealKeys = trusted }})
	if err := b.App.KeyWatch.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if a := b.App.KeyWatch.Alarms(); len(a) != 0 {
		t.Fatalf("a replica trusting the new key alarms: %+v", a)
	}
}

// TestKeylessReplicaMeetsSealedRows: a replica without the signing key,
// already running when the region's rows become sealed (a keyed replica
// beside it writes a sealed instance), seals its trust on the first
// sealed row it reads and raises keyless_sealed. From then on it believes
// no row: not the keyed replica's sealed instance (it cannot check it),
// and none of the unsealed rows written through itself since (a new
// instance, a deregistration, an override taking one out), exactly as a
// keyed replica would not. It drains nothing: the three instances it
// routed stay routed. A second keyless replica started later is told by
// its key watch's count as well.
func TestKeylessReplicaMeetsSealedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	keyless := func(pc *policy.Config) { pc.Sealer, pc.SealKeys = nil, nil }
	k := apptest.New(t, apptest.Options{Policy: keyless})
	k.Seed(t)
	admin := k.Token(t, apptest.Admin)
	register := func(s *apptest.Stack, addr string) string {
		t.Helper()
		r := s.JSON(t, "POST", "/v1/services/web/instances", s.Token(t, apptest.Admin), `{"address":"`+addr+`","port":8080,"zone":"az1"}`)
		if r.Status != http.StatusCreated {
			t.Fatalf("register %s: %d %s", addr, r.Status, r.Body)
		}
		var in struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(r.Body, &in); err != nil || in.ID == "" {
			t.Fatalf("register %s: %s (%v)", addr, r.Body, err)
		}
		return in.ID
	}
	ids := map[string]string{}
	for _, addr := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		ids[addr] = register(k, addr)
	}
	routed := func() []string {
		t.Helper()
		k.SyncNow(t)
		snap, ok := k.Evaluator.Snapshot("web")
		if !ok {
			t.Fatal("no snapshot of web")
		}
		var out []string
		for _, in := range snap.Instances {
			out = append(out, in.Address)
		}
		slices.Sort(out)
		return out
	}
	want := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}
	if got := routed(); !slices.Equal(got, want) {
		t.Fatalf("before the seals: %v, want %v", got, want)
	}
	if err := k.App.KeyWatch.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if a := k.App.KeyWatch.Alarms(); len(a) != 0 {
		t.Fatalf("alarms before any sealed row: %+v", a)
	}

	// A keyed replica joins and writes a sealed row.
	b := apptest.New(t, apptest.Options{Pool: k.Pool})
	register(b, "10.0.0.9")
	k.TakeOver(t)
	if got := routed(); !slices.Equal(got, want) {
		t.Fatalf("after the first sealed row: %v, want %v (the sealed row cannot be checked; nothing drained)", got, want)
	}
	alarms := k.App.KeyWatch.Alarms()
	if len(alarms) != 1 || alarms[0].Kind != app.AlarmKeylessSealed || !strings.Contains(alarms[0].Detail, "no signing key") {
		t.Fatalf("alarms after reading a sealed row: %+v, want keyless_sealed", alarms)
	}

	// Unsealed rows written through the keyless replica itself: a new
	// instance, a deregistration, an override taking one out.
	register(k, "10.0.0.4")
	if r := k.Do(t, "DELETE", "/v1/instances/"+ids["10.0.0.1"], admin, "application/json", `{"justification":"a deregistration written without the key"}`); r.Status/100 != 2 {
		t.Fatalf("deregister: %d %s", r.Status, r.Body)
	}
	r := k.JSON(t, "POST", "/v1/overrides", k.Token(t, apptest.Admin),
		`{"instance_id":"`+ids["10.0.0.2"]+`","action":"mark_ineligible","justification":"an override written without the key"}`)
	if r.Status/100 != 2 {
		t.Fatalf("override: %d %s", r.Status, r.Body)
	}
	if got := routed(); !slices.Equal(got, want) {
		t.Fatalf("after unsealed writes: %v, want %v kept", got, want)
	}
	if _, ok := k.App.InForce.For(uuid.MustParse(ids["10.0.0.2"]), time.Now()); ok {
		t.Fatal("the unsealed override is in force on the keyless replica")
	}
	if err := k.App.KeyWatch.Check(ctx); err != nil {
		t.Fatal(err)
	}
	alarms = k.App.KeyWatch.Alarms()
	if len(alarms) != 1 || !strings.Contains(alarms[0].Detail, "live rows are sealed") {
		t.Fatalf("alarms after the count: %+v, want keyless_sealed with the count", alarms)
	}
	if r := k.Do(t, "GET", "/v1/alarms", admin, "", ""); !strings.Contains(string(r.Body), app.AlarmKeylessSealed) {
		t.Fatalf("GET /v1/alarms does not list keyless_sealed: %s", r.Body)
	}

	// Another keyless replica, told by its key watch's count.
	c := apptest.New(t, apptest.Options{Pool: k.Pool, Policy: keyless})
	if err := c.App.KeyWatch.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if a := c.App.KeyWatch.Alarms(); len(a) != 1 || a[0].Kind != app.AlarmKeylessSealed {
		t.Fatalf("a keyless replica started on the sealed database: %+v", a)
	}
}
