package registry_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/testclock"
)

// TestAuthzCacheFromAPeer (issue 27): a replica that cannot read its
// database takes a peer's rows of services and grants (Snapshot,
// LoadSnapshot) and decides as the peer does; a grant row the peer made
// up (its seal does not verify) is not believed, nor is anything under a
// key the receiver does not trust; once the copy has been read from the
// database, a peer's is refused.
func TestAuthzCacheFromAPeer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	newSigner := func() *audit.KeyFileSigner {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return audit.NewKeySigner(priv)
	}
	signer := newSigner()
	pool := dbtest.New(t)
	clk := testclock.New(time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC))
	newCache := func(s *audit.KeyFileSigner) *registry.AuthzCache {
		reg, err := registry.New(registry.Config{Pool: pool, Region: "eu-west-1", Now: clk.Now, LeaseClock: clk.Now, Sealer: s})
		if err != nil {
			t.Fatal(err)
		}
		c, err := registry.NewAuthzCache(registry.AuthzCacheConfig{Registry: reg, Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	peer := newCache(signer)
	if _, err := peer.Snapshot(); !errors.Is(err, registry.ErrNoSnapshot) {
		t.Fatalf("a snapshot before any read: %v", err)
	}
	reg, err := registry.New(registry.Config{Pool: pool, Region: "eu-west-1", Now: clk.Now, LeaseClock: clk.Now, Sealer: signer})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"web", "api", "db"} {
		if _, _, err := reg.PutService(ctx, admin, name, registry.ServiceSpec{Owner: "payments"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := reg.PutGrants(ctx, admin, "web", []string{"api"}); err != nil {
		t.Fatal(err)
	}
	if err := peer.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	snap, err := peer.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	wl := func(svc string) identity.Principal {
		return identity.Principal{Kind: identity.KindWorkload, Subject: svc + "-1", Service: svc}
	}

	fresh := newCache(signer)
	if err := fresh.LoadSnapshot(snap); err != nil {
		t.Fatal(err)
	}
	if n, err := fresh.ServiceCount(); err != nil || n != 3 {
		t.Fatalf("services from the peer: %d, %v", n, err)
	}
	for _, tc := range []struct {
		caller, service string
		want            bool
	}{{"api", "web", true}, {"db", "web", false}, {"web", "api", false}} {
		err := fresh.MayResolve(wl(tc.caller), tc.service)
		if peerErr := peer.MayResolve(wl(tc.caller), tc.service); (err == nil) != tc.want || (peerErr == nil) != tc.want {
			t.Errorf("%s resolving %s: from the peer's rows %v, at the peer %v; want allowed=%v", tc.caller, tc.service, err, peerErr, tc.want)
		}
	}

	// A grant the peer made up: a copy of a sealed row under another caller.
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(snap, &raw); err != nil {
		t.Fatal(err)
	}
	var grants []map[string]any
	if err := json.Unmarshal(raw["grants"], &grants); err != nil {
		t.Fatal(err)
	}
	forged := map[string]any{}
	for k, v := range grants[0] {
		forged[k] = v
	}
	forged["caller"] = "db"
	grants = append(grants, forged)
	if raw["grants"], err = json.Marshal(grants); err != nil {
		t.Fatal(err)
	}
	tampered, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	other := newCache(signer)
	if err := other.LoadSnapshot(tampered); err != nil {
		t.Fatal(err)
	}
	if err := other.MayResolve(wl("db"), "web"); err == nil {
		t.Error("a made-up grant was believed")
	}
	if err := other.MayResolve(wl("api"), "web"); err != nil {
		t.Errorf("the sealed grant beside a made-up one: %v", err)
	}

	// A newer release beside this one (a rolling upgrade) may add members
	// to the snapshot and its rows: they are ignored, the rows believed as
	// their seals say.
	var top map[string]any
	if err := json.Unmarshal(snap, &top); err != nil {
		t.Fatal(err)
	}
	top["release"] = "next"
	for _, k := range []string{"services", "grants"} {
		for _, row := range top[k].([]any) {
			row.(map[string]any)["tenure"] = map[string]any{"epoch": 7}
		}
	}
	newer, err := json.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	fromNewer := newCache(signer)
	if err := fromNewer.LoadSnapshot(newer); err != nil {
		t.Fatalf("a snapshot with members this release does not know: %v", err)
	}
	if n, err := fromNewer.ServiceCount(); err != nil || n != 3 {
		t.Fatalf("services from a newer peer: %d, %v", n, err)
	}
	if err := fromNewer.MayResolve(wl("api"), "web"); err != nil {
		t.Errorf("a sealed grant from a newer peer: %v", err)
	}
	if err := fromNewer.MayResolve(wl("db"), "web"); err == nil {
		t.Error("a newer peer's snapshot granted what no row grants")
	}

	// Under a key the receiver does not trust, no grant is believed.
	stranger := newCache(newSigner())
	if err := stranger.LoadSnapshot(snap); err != nil {
		t.Fatal(err)
	}
	if err := stranger.MayResolve(wl("api"), "web"); err == nil {
		t.Error("a grant sealed by an untrusted key was believed")
	}

	// Read from the database once: a peer's copy is not taken any more.
	if err := fresh.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fresh.LoadSnapshot(snap); err == nil {
		t.Error("a peer's copy was taken after the database's")
	}
}
