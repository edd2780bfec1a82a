package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/musterhq/muster/internal/peer"
	"github.com/musterhq/muster/internal/registry"
	startstop "github.com/musterhq/muster/internal/worker"
	"github.com/musterhq/muster/server"
)

// WorkerPeerAuthz takes the authorisation copy (services and grants) from
// the configured peers while the replica runs without its database
// (StartFromPeers); it stops when the database returns (Resume), and the
// copy is read from PostgreSQL again.
const WorkerPeerAuthz = "peer-authz"

// fromPeersWorkers are the workers a replica runs while it serves views
// without its database: the database monitor (it says when PostgreSQL
// answers), the relay (the views), the authorisation copy from the peers,
// and the surfaces that serve views (DNS, xDS). Everything else needs
// PostgreSQL and starts on Resume.
var fromPeersWorkers = []string{WorkerMonitor, WorkerPeerAuthz, WorkerRelay, WorkerDNS, WorkerXDS}

// StartFromPeers starts the replica without its database: it
// takes the current views from its peers (the relay, from Config.Peers
// until the ownership worker can read the live replicas) and the
// authorisation copy from them (GET /v1/peer/authz), and serves them
// read-only: nothing is published, evaluated or written, and reports are
// refused 503 read-only. /readyz says ready once a peer's opening
// snapshot has arrived whole and the authorisation copy is loaded. Resume
// completes the start when the database returns.
func (a *App) StartFromPeers(ctx context.Context) error {
	if a.Relay == nil || a.peerAuthz == nil {
		return errors.New("app: starting without the database needs the region's signing key and the peers' addresses (Config.Peers)")
	}
	a.fromPeers.Store(true)
	a.readOnly.Store(true)
	if err := a.startWorkers(ctx, func(name string) bool { return slices.Contains(fromPeersWorkers, name) }); err != nil {
		return err
	}
	a.log.Warn("started without the database: serving the views the peers relay, read-only, until PostgreSQL answers",
		"peers", a.peerAuthz.peers)
	return nil
}

// Resume completes a start made without the database (StartFromPeers),
// once PostgreSQL answers: the authorisation copy is read from it again,
// and every worker that was not started starts, in order (the evaluator
// rebuilds, the ownership worker joins the region, the publisher adopts
// the views the hub holds before it publishes). The hub keeps what it
// relayed: it never takes a version at or below one it holds, so nothing
// goes backwards. Reports are taken again once every worker runs.
func (a *App) Resume(ctx context.Context) error {
	if !a.fromPeers.Load() {
		return errors.New("app: Resume follows StartFromPeers")
	}
	a.lifecycle.Lock()
	defer a.lifecycle.Unlock()
	if a.shut {
		return errors.New("app: shutting down; not resumed")
	}
	if !a.readOnly.Load() {
		return nil // resumed already
	}
	a.peerAuthz.Stop()
	a.mu.Lock()
	delete(a.started, WorkerPeerAuthz)
	a.mu.Unlock()
	if err := a.startWorkers(ctx, func(name string) bool { return name != WorkerPeerAuthz && !a.Running(name) }); err != nil {
		return err
	}
	a.readOnly.Store(false)
	a.log.Info("the database answers: the start is complete, this replica evaluates, owns shards and publishes again")
	return nil
}

// ReadOnly reports whether the replica serves views without its database
// (StartFromPeers until Resume).
func (a *App) ReadOnly() bool { return a.readOnly.Load() }

// peerReady is /readyz's test while the replica started without its
// database: a peer's opening snapshot arrived whole, the authorisation
// copy is loaded, and the hub holds views if any service exists.
func (a *App) peerReady() error {
	switch {
	case !a.fromPeers.Load():
		return errors.New("not started from peers")
	case !a.Relay.Synced():
		return errors.New("started without the database; no peer's views have arrived whole yet")
	}
	n, err := a.Authz.ServiceCount()
	switch {
	case err != nil:
		return fmt.Errorf("started without the database; %w", err)
	case n > 0 && a.Hub.Views() == 0:
		return errors.New("started without the database; the peers relayed no view yet")
	}
	return nil
}

// viewsReady is whether views can be served: the normal test (the
// evaluator rebuilt, views published) or, for a replica started without
// its database, the peers' views held (peerReady).
func (a *App) viewsReady(servingReady func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		err := servingReady(ctx)
		if err == nil || !a.fromPeers.Load() {
			return err
		}
		if perr := a.peerReady(); perr != nil {
			return errors.Join(err, perr)
		}
		return nil
	}
}

// peerAuthzWorker loads the authorisation copy from a peer
// (server.PeerAuthzPath), every Interval, trying the peers in a random
// order until one answers.
type peerAuthzWorker struct {
	peers    []string
	signer   peer.Signer
	authz    *registry.AuthzCache
	client   *http.Client
	interval time.Duration
	log      *slog.Logger
	runner   startstop.Runner
	failing  bool
}

func (w *peerAuthzWorker) Start(ctx context.Context) error { return w.runner.Start(ctx, w.loop) }

// Stop ends the loop and waits. Safe to call twice or before Start.
func (w *peerAuthzWorker) Stop() { w.runner.Stop() }

func (w *peerAuthzWorker) loop(ctx context.Context) {
	w.runOnce(ctx)
	startstop.Every(ctx, w.interval, w.runOnce)
}

func (w *peerAuthzWorker) runOnce(ctx context.Context) {
	var errs []error
	for _, i := range rand.Perm(len(w.peers)) {
		err := w.fetch(ctx, w.peers[i])
		if err == nil {
			if w.failing {
				w.log.Info("services and grants taken from a peer again", "peer", w.peers[i])
				w.failing = false
			}
			return
		}
		errs = append(errs, fmt.Errorf("%s: %w", w.peers[i], err))
	}
	if ctx.Err() == nil && !w.failing {
		w.failing = true
		w.log.Warn("no peer handed its services and grants; the last copy serves (none: watch and resolve answer 503)", "err", errors.Join(errs...))
	}
}

func (w *peerAuthzWorker) fetch(ctx context.Context, base string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+server.PeerAuthzPath, nil)
	if err != nil {
		return err
	}
	// The peer is known by its address only: the request names it so,
	// and the peer takes it as meant for it when it advertises that
	// address (MUSTER_ADVERTISE_URL, the name MUSTER_PEERS lists).
	if err := w.signer.Sign(ctx, req, strings.TrimSuffix(base, "/"), nil); err != nil {
		return fmt.Errorf("sign the request: %w", err)
	}
	res, err := w.client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("the peer answered %s: %s", res.Status, strings.TrimSpace(string(body[:min(len(body), 512)])))
	}
	return w.authz.LoadSnapshot(body)
}

// configuredPeers are the peers named in Config.Peers, for the relay
// while the ownership worker has not read the live replicas: each is
// known by its address (it may list itself; that one is left out).
func configuredPeers(peers []string, self string) []string {
	var out []string
	for _, p := range peers {
		p = strings.TrimSuffix(strings.TrimSpace(p), "/")
		if p != "" && p != strings.TrimSuffix(self, "/") && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}
