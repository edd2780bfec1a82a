package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/resolver"
)

const resolveUsage = "usage: muster resolve SERVICE [--server URL] [--cache DIR] [--token T] [--data DIR] [--watch] [--json] [--timeout 5s]"

// cmdResolve resolves a service through the resolver library: live from
// muster's watch stream when it answers, else from the last-known-good
// cache.
func cmdResolve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		serverURL, cacheDir, token, dataDir, caFile string
		certFile, keyFile                           string
		watch, asJSON                               bool
		timeout                                     time.Duration
	)
	fs := cli.NewFlags("resolve", stderr)
	fs.StringVar(&serverURL, "server", "http://127.0.0.1:8080", "muster's base URL")
	fs.StringVar(&cacheDir, "cache", "", "last-known-good cache folder (default DATA/resolver-cache)")
	fs.StringVar(&token, "token", "", "bearer token (default: a viewer token minted by the dev issuer in --data)")
	fs.StringVar(&dataDir, "data", ".muster", "dev data folder holding the dev issuer's key")
	fs.StringVar(&caFile, "ca", "", "PEM CA bundle to trust for an https --server (default the system roots)")
	fs.StringVar(&certFile, "cert", "", "PEM client certificate for an https --server that asks for one (mutual TLS), with --key; with a SPIFFE ID muster maps to a workload, no token is needed")
	fs.StringVar(&keyFile, "key", "", "PEM private key of --cert")
	fs.BoolVar(&watch, "watch", false, "print every new version until interrupted")
	fs.BoolVar(&asJSON, "json", false, "print the view as JSON")
	fs.DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for muster before answering from the cache")
	var service string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		service, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return cli.ErrUsage
	}
	if service == "" && fs.NArg() > 0 {
		service = fs.Arg(0)
		if err := fs.Parse(fs.Args()[1:]); err != nil {
			return cli.ErrUsage
		}
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "muster resolve: unexpected argument %q\n", fs.Arg(0))
		return cli.ErrUsage
	}
	if service == "" {
		fmt.Fprintln(stderr, resolveUsage)
		return cli.ErrUsage
	}
	if cacheDir == "" {
		cacheDir = filepath.Join(dataDir, "resolver-cache")
	}
	getCert, err := clientCertificate(certFile, keyFile)
	if err != nil {
		return err
	}
	tokenFn := func(context.Context) (string, error) { return token, nil }
	if token == "" && getCert != nil {
		// The certificate is the identity: a dev token would decide
		// instead of it.
		tokenFn = nil
	} else if token == "" {
		tok, err := devViewerToken(dataDir)
		if err != nil {
			fmt.Fprintf(stderr, "muster resolve: no token (%v); muster will refuse the stream, answering from the cache\n", err)
		}
		token = tok
	}

	roots, err := caPool(caFile)
	if err != nil {
		return err
	}
	c, err := resolver.New(ctx, resolver.Config{
		URLs: []string{serverURL}, Services: []string{service}, CacheDir: cacheDir, RootCAs: roots,
		GetClientCertificate: getCert,
		Token:                tokenFn,
		Logger:               cli.QuietLogger(stderr),
	})
	if err != nil {
		return err
	}
	defer c.Close()

	waitSynced(ctx, c, timeout, []string{service})
	r, err := c.Resolve(service)
	if err != nil {
		st := c.Stats()
		why := "no answer within " + timeout.String()
		switch {
		case st.Connected:
			// Subscribed, but muster holds no view of it yet (its
			// evaluator is rebuilding after a restart, say): a synced
			// event, had one come, is not an answer.
			why = "it accepted the subscription but sent no view within " + timeout.String() + "; it may still be rebuilding after a restart"
		case st.LastError != nil:
			why = st.LastError.Error()
		}
		return fmt.Errorf("no view of %s: muster at %s did not serve one (%s) and nothing is cached in %s", service, serverURL, why, cacheDir)
	}
	if err := printResult(stdout, c, r, asJSON); err != nil {
		return err
	}
	if !watch {
		return nil
	}
	// A new version routing uses, and a hold's newest version, are news;
	// the newest version alone is not while nothing is held.
	type shown struct{ version, held uint64 }
	seen := func(r resolver.Result) shown {
		s := shown{version: r.Snapshot.Version()}
		if r.Hold != nil {
			s.held = r.Hold.NewestVersion
		}
		return s
	}
	last := seen(r)
	for {
		ch := c.Updated()
		if r, err := c.Resolve(service); err == nil && seen(r) != last {
			last = seen(r)
			if err := printResult(stdout, c, r, asJSON); err != nil {
				return err
			}
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil
		}
	}
}

// waitSynced waits until the client holds a current view of services
// (ClientStats.Synced: a view of each and the stream caught up; a synced
// event without a view does not count), or timeout passed. A failed
// subscription ends the wait early only when the cache already holds a
// view of every service (muster is unreachable: answer from the cache
// now); with nothing to answer from, the wait goes on while the client
// resubscribes, since a muster that is starting (503, not ready yet) or
// restarting is usually there within moments. Either way the caller
// answers from whatever the cache holds.
func waitSynced(ctx context.Context, c *resolver.Client, timeout time.Duration, services []string) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		st := c.Stats()
		if st.Synced || (!st.Connected && st.LastError != nil && cachedAll(c, services)) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// cachedAll reports whether c can answer for every one of services.
func cachedAll(c *resolver.Client, services []string) bool {
	for _, s := range services {
		if _, err := c.Resolve(s); err != nil {
			return false
		}
	}
	return true
}

// resolveJSON is what --json prints: the view routing uses, where the
// answer came from and how old it is (as the text output says), and,
// while a client guard holds it, the hold.
type resolveJSON struct {
	resolver.View
	// Source is "live" (the open stream has caught up: this is what
	// muster holds now) or "cache" (the last-known-good copy: muster is
	// unreachable, or has not sent a current view yet; SourceReason
	// says which).
	Source       string `json:"source"`
	SourceReason string `json:"source_reason,omitempty"`
	// AgeSeconds is how old the view's data is: ResolvedAt minus the
	// view's generated_at, in seconds (to the millisecond). ReceivedAt is
	// when this client applied the view or loaded it from the cache.
	AgeSeconds float64   `json:"age_seconds"`
	ReceivedAt time.Time `json:"received_at"`
	ResolvedAt time.Time `json:"resolved_at"`
	Hold       *holdJSON `json:"hold,omitempty"`
}

// Where an answer came from, as resolve states it.
const (
	sourceLive  = "live"
	sourceCache = "cache"
)

// answerSource says whether what the client holds is live (the stream has
// caught up) or the cache's, and why the cache's.
func answerSource(st resolver.ClientStats) (source, reason string) {
	switch {
	case st.Synced:
		return sourceLive, ""
	case st.Connected:
		return sourceCache, "muster is connected but has not sent a current view yet"
	case st.LastError != nil:
		return sourceCache, "muster unreachable: " + st.LastError.Error()
	default:
		return sourceCache, "muster has not answered yet"
	}
}

type holdJSON struct {
	Reason         string    `json:"reason"` // shrink_capped or would_empty
	Since          time.Time `json:"since"`
	FollowAt       time.Time `json:"follow_at"`
	HeldVersion    uint64    `json:"held_version"`
	HeldRoutable   int       `json:"held_routable"`
	NewestVersion  uint64    `json:"newest_version"`
	NewestRoutable int       `json:"newest_routable"`
}

func newHoldJSON(h *resolver.Hold) *holdJSON {
	if h == nil {
		return nil
	}
	reason := "shrink_capped"
	if errors.Is(h.Reason, resolver.ErrWouldEmpty) {
		reason = "would_empty"
	}
	return &holdJSON{
		Reason: reason, Since: h.Since, FollowAt: h.FollowAt,
		HeldVersion: h.HeldVersion, HeldRoutable: h.HeldRoutable,
		NewestVersion: h.NewestVersion, NewestRoutable: h.NewestRoutable,
	}
}

// holdLine describes a hold for people, its times relative to now.
func holdLine(h *resolver.Hold, now time.Time) string {
	reason := "shrink capped"
	if errors.Is(h.Reason, resolver.ErrWouldEmpty) {
		reason = "would empty"
	}
	follow := "in " + h.FollowAt.Sub(now).Truncate(time.Second).String()
	if !now.Before(h.FollowAt) {
		follow = "now" // at the next update or sweep
	}
	return fmt.Sprintf("held: v%d routes %d, newest v%d has %d (%s) since %s (%s ago), follows at %s (%s) unless muster sends a larger set",
		h.HeldVersion, h.HeldRoutable, h.NewestVersion, h.NewestRoutable, reason,
		h.Since.UTC().Format(time.RFC3339), now.Sub(h.Since).Truncate(time.Second), h.FollowAt.UTC().Format(time.RFC3339), follow)
}

// printResult prints r for people, or as one line of JSON.
func printResult(w io.Writer, c *resolver.Client, r resolver.Result, asJSON bool) error {
	snap := r.Snapshot
	source, reason := answerSource(c.Stats())
	age := snap.Age(r.Now)
	if asJSON {
		b, err := json.Marshal(resolveJSON{
			View: snap.View(), Source: source, SourceReason: reason,
			AgeSeconds: age.Round(time.Millisecond).Seconds(), ReceivedAt: snap.ReceivedAt().UTC(), ResolvedAt: r.Now.UTC(),
			Hold: newHoldJSON(r.Hold),
		})
		if err != nil {
			return fmt.Errorf("encode the view of %s: %w", snap.Service(), err)
		}
		fmt.Fprintf(w, "%s\n", b)
		return nil
	}
	said := source
	if source == sourceCache {
		said = "cached"
		if reason != "" {
			said += "; " + reason
		}
	}
	fmt.Fprintf(w, "%s version %d, age %s (%s)\n", snap.Service(), snap.Version(), age.Truncate(time.Second), said)
	if r.Hold != nil {
		fmt.Fprintln(w, "  "+holdLine(r.Hold, r.Now))
	}
	for _, name := range slices.Sorted(maps.Keys(snap.Zones())) {
		z := snap.Zones()[name]
		registered := ""
		if z.Registered != nil {
			registered = fmt.Sprintf(", %d registered", *z.Registered)
		}
		fmt.Fprintf(w, "  zone %s: guard %s, %d of %d eligible%s, traffic %g\n", name, z.Guard, z.Eligible, z.Total, registered, z.Traffic())
	}
	if n := len(snap.HealthUnknown()); n > 0 {
		fmt.Fprintf(w, "  %d endpoint(s) with health unknown: muster has no recent evidence either way; they stay in rotation\n", n)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tADDRESS\tZONE\tSTATE\tWEIGHT\tHEALTH")
	var overrides []string
	for _, e := range snap.Endpoints() {
		state := e.State
		if e.LeaseExpired {
			state += " (lease expired; kept by the zone's guard)"
		}
		fmt.Fprintf(tw, "%s\t%s:%d\t%s\t%s\t%g\t%s\n", e.InstanceID, e.Address, e.Port, e.Zone, state, e.Weight, e.Health)
		if e.Override != nil {
			overrides = append(overrides, e.InstanceID+": "+e.Override.Reason)
		}
	}
	tw.Flush()
	for _, o := range overrides {
		fmt.Fprintln(w, "  "+o)
	}
	return nil
}

// devViewerToken mints an operator viewer token from the dev issuer in dir.
func devViewerToken(dir string) (string, error) {
	if _, err := os.Stat(filepath.Join(dir, "dev-issuer-key.pem")); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("no dev issuer in %s; pass --token", dir)
		}
		return "", err
	}
	iss, err := devissuer.LoadOrCreate(dir)
	if err != nil {
		return "", err
	}
	return iss.Mint(devissuer.TokenRequest{
		Kind: identity.KindOperator, Subject: "muster-resolve", Role: identity.RoleViewer, TTL: time.Hour,
	}, time.Now())
}
