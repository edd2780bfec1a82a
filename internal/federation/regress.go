package federation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/resolver"
)

// A peer region whose database was restored publishes versions below
// those this region holds. Its watch cannot say so: this region's client
// names the versions it holds (held=), and the peer, taking itself to be
// behind a client that is ahead of it, sends nothing until it passes
// them; a full view below the version held would be refused as stale
// anyway. So the follower reads the peer's current versions whole (a
// watch that names nothing held, read to its synced frame) after every
// reconnect (a restore restarts the peer) and every RegressCheck, and
// compares them with the copy held.
//
// A version below the one held is suspected at the first read and taken
// at a read at least RegressAfter later that still finds it below: a
// replica of the peer whose relay lags serves an older version for a
// few seconds, and must not make this region go back in time. Taken,
// the view replaces the copy held (Aggregate.regress), is served under
// the version after the last one served (so this region's subscribers,
// who hold that one, take it) and is marked regressed, with the
// peer_regressed alarm and a region.regressed audit row. The follower's
// client is made again without its copy of those services, so it
// follows the peer's new versions from there.
//
// What a peer can do with this is what it can already do with its own
// views (it is their authority): change its own services' views, at
// most once per RegressAfter per service by this way. It touches no
// other region's series and no local service, and served versions never
// go back.

// seriesFile is where a follower keeps its series' offsets, beside the
// peer's views in its cache folder, so a restarted replica serves the
// same versions.
const seriesFile = "series.json"

// maybeProbe starts a read of the peer's current versions when one is
// due: the stream is current, no heal is pending, and the client
// reconnected since the last read or the next read's time has come.
func (f *Follower) maybeProbe(ctx context.Context, now time.Time) {
	if f.probing || f.client == nil || f.partitioned || len(f.services) == 0 {
		return
	}
	st := f.client.Stats()
	if !st.Connected || !st.Synced {
		return
	}
	reconnects := f.reconnects + st.Reconnects
	if reconnects == f.probedReconnects && now.Before(f.nextProbe) {
		return
	}
	f.probedReconnects, f.probing = reconnects, true
	names := slices.Clone(f.services)
	f.probeWG.Go(func() {
		views := f.readCurrent(ctx, names)
		select {
		case f.probed <- views:
		case <-ctx.Done():
		}
	})
}

// readCurrent reads the peer's current views of names with a client that
// holds nothing (so the peer sends each one whole), up to its synced
// frame or HTTPTimeout. A read that does not complete returns what it
// got: only services it read are judged.
func (f *Follower) readCurrent(ctx context.Context, names []string) []RemoteView {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.HTTPTimeout)
	defer cancel()
	c, err := resolver.New(ctx, resolver.Config{
		URLs: f.peer.URLs, Token: f.token, Services: names, HTTPClient: f.watchClient,
		BaseBackoff: f.cfg.BaseBackoff, MaxBackoff: f.cfg.MaxBackoff,
		ReportInterval: -1, ConfirmAfter: time.Nanosecond, Logger: f.log,
	})
	if err != nil {
		f.log.Warn("cannot read the peer's current versions", "err", f.redact(err.Error()))
		return nil
	}
	defer c.Close()
	t := time.NewTicker(f.cfg.Tick)
	defer t.Stop()
	for !c.Stats().Synced {
		select {
		case <-ctx.Done():
			return nil
		case <-c.Updated():
		case <-t.C:
		}
	}
	var out []RemoteView
	for _, s := range names {
		if r, err := c.Resolve(s); err == nil {
			out = append(out, RemoteView{Region: f.peer.Name, View: r.Snapshot.View(), ReceivedAt: r.Snapshot.ReceivedAt()})
		}
	}
	return out
}

// judge compares a read of the peer's current views with the copy held:
// a service below its version held is suspected, and taken as regressed
// when it was suspected at least RegressAfter ago; one at or above it is
// no longer suspected.
func (f *Follower) judge(ctx context.Context, views []RemoteView, now time.Time) {
	f.probing = false
	if f.suspects == nil {
		f.suspects = map[string]time.Time{}
	}
	read := map[string]bool{}
	var confirmed []RemoteView
	for _, v := range views {
		s := v.View.Service
		read[s] = true
		held, _, ok := f.agg.View(f.peer.Name, s)
		if !ok || v.View.Version >= held.View.Version {
			delete(f.suspects, s)
			continue
		}
		first, ok := f.suspects[s]
		switch {
		case !ok:
			f.suspects[s] = now
			f.log.Info("the peer serves a version below the one held; taken if it still does after the confirmation time",
				"service", s, "held", held.View.Version, "peer", v.View.Version, "regress_after", f.cfg.RegressAfter)
		case now.Sub(first) >= f.cfg.RegressAfter:
			confirmed = append(confirmed, v)
		}
	}
	for s := range f.suspects {
		if !read[s] && !slices.Contains(f.services, s) {
			delete(f.suspects, s) // no longer followed
		}
	}
	if len(confirmed) > 0 {
		f.takeRegressions(ctx, confirmed, now)
	}
	f.nextProbe = now.Add(f.cfg.RegressCheck)
	for _, first := range f.suspects {
		if at := first.Add(f.cfg.RegressAfter); at.Before(f.nextProbe) {
			f.nextProbe = at
		}
	}
	f.saveSeries()
}

// takeRegressions takes views whose versions went backwards at the peer,
// emits them under their new served versions, alarms (through the
// aggregate), queues the audit row and makes the client follow the
// peer's new versions of those services.
func (f *Follower) takeRegressions(ctx context.Context, views []RemoteView, now time.Time) {
	var took []RemoteView
	var names []string
	for _, v := range views {
		delete(f.suspects, v.View.Service)
		if f.agg.regress(v, now) {
			took = append(took, v)
			names = append(names, v.View.Service)
		}
	}
	if len(took) == 0 {
		return
	}
	f.agg.emit(took)
	f.metrics.regressions.WithLabelValues(f.peer.Name).Add(float64(len(took)))
	var regressed []RegressedService
	for _, st := range f.agg.Regions() {
		if st.Region == f.peer.Name {
			regressed = slices.DeleteFunc(st.Regressed, func(r RegressedService) bool { return !slices.Contains(names, r.Service) })
		}
	}
	summary := fmt.Sprintf("region %s's versions went backwards for %d services (%s); its current views taken all the same, served under versions above those served before",
		f.peer.Name, len(names), strings.Join(names, ", "))
	f.log.Warn("peer region's versions went backwards: its current views taken, marked regressed", "summary", summary)
	if f.cfg.Audit != nil {
		f.pending = append(f.pending, pendingRow{since: now, entry: audit.Entry{
			ActorKind: "system", Actor: "system:federation", Action: ActionRegressed,
			TargetKind: "region", Target: f.peer.Name, Outcome: audit.Accepted,
			Reason: summary, After: regressed,
		}})
	}
	// The client holds the old versions and would ignore the peer's new
	// ones: it is made again without its copy of these services.
	if f.cacheDir != "" {
		for _, s := range names {
			if err := os.Remove(resolver.FileName(f.cacheDir, s)); err != nil && !errors.Is(err, os.ErrNotExist) {
				f.log.Warn("cannot remove the old copy of a regressed service", "service", s, "err", err)
			}
		}
	}
	f.follow(ctx, f.services)
}

// loadSeries restores the series' offsets kept on disk (at start).
func (f *Follower) loadSeries() {
	if f.cacheDir == "" {
		return
	}
	b, err := os.ReadFile(filepath.Join(f.cacheDir, seriesFile))
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			f.log.Warn("cannot read the series' offsets", "err", err)
		}
		return
	}
	var states map[string]SeriesState
	if err := json.Unmarshal(b, &states); err != nil {
		f.log.Warn("the series' offsets on disk do not decode; versions are served from the peer's as they are", "err", err)
		return
	}
	f.agg.setSeriesStates(f.peer.Name, states)
	_, f.savedRev = f.agg.seriesStates(f.peer.Name)
}

// saveSeries writes the series' offsets to disk when they changed.
func (f *Follower) saveSeries() {
	if f.cacheDir == "" {
		return
	}
	states, rev := f.agg.seriesStates(f.peer.Name)
	if rev == f.savedRev {
		return
	}
	b, err := json.Marshal(states)
	if err == nil {
		err = os.MkdirAll(f.cacheDir, 0o700)
	}
	if err == nil {
		tmp := filepath.Join(f.cacheDir, seriesFile+".tmp")
		if err = os.WriteFile(tmp, b, 0o600); err == nil {
			err = os.Rename(tmp, filepath.Join(f.cacheDir, seriesFile))
		}
	}
	if err != nil {
		f.log.Warn("cannot keep the series' offsets on disk; a restart would serve the peer's versions as they are", "err", err)
		return
	}
	f.savedRev = rev
}
