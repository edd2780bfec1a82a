package app_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"net/http"
	"strings"
	"testing"

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
