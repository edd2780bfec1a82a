package breakglass

import (
	"context"
	"fmt"
	"time"

	"github.com/musterhq/muster/internal/assembler"
	bgworker "github.com/musterhq/muster/internal/worker"
)

// Start lists the live grants now, then every WatchEvery, for Alarms.
func (s *Service) Start(ctx context.Context) error {
	return s.runner.Start(ctx, func(ctx context.Context) {
		s.tick(ctx)
		bgworker.Every(ctx, s.cfg.WatchEvery, s.tick)
	})
}

// Stop stops the watch; safe twice, and before Start.
func (s *Service) Stop() { s.runner.Stop() }

func (s *Service) tick(ctx context.Context) {
	if err := s.RunOnce(ctx); err != nil && ctx.Err() == nil {
		s.log.Warn("list the live break-glass grants", "err", err)
	}
}

// RunOnce lists the live grants and replaces the alarms. A list that
// fails (PostgreSQL away) leaves the alarms as they were: a live grant
// stays visible until it expires.
func (s *Service) RunOnce(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	now := s.cfg.Now()
	grants, err := live(ctx, s.cfg.Pool, now)
	if err != nil {
		return err
	}
	var alarms []assembler.Alarm
	var ends []time.Time
	for _, g := range grants {
		if err := g.verify(s.cfg.Keys); err != nil || g.Region != s.cfg.Region {
			if err == nil {
				err = fmt.Errorf("it names region %q", g.Region)
			}
			alarms = append(alarms, assembler.Alarm{Kind: AlarmUnsealed, Since: g.IssuedAt, Detail: fmt.Sprintf(
				"break-glass grant %s for %s (%s, until %s) is not as muster wrote it (%v): its token is refused. "+
					"Someone wrote the table breakglass_grants outside muster: find out who (docs/identity.md)",
				g.ID, g.Operator, g.Role, g.ExpiresAt.Format(time.RFC3339), err)})
			ends = append(ends, g.ExpiresAt)
			continue
		}
		alarms = append(alarms, assembler.Alarm{Kind: AlarmActive, Since: g.IssuedAt, Detail: fmt.Sprintf(
			"break-glass grant %s: %s acts as %s until %s, issued by %s: %q. Every action is audited as %s#operator:%s; "+
				"revoke it when done (muster breakglass revoke %s)",
			g.ID, g.Operator, g.Role, g.ExpiresAt.Format(time.RFC3339), g.IssuedBy, g.Reason, PrincipalIssuer, g.Operator, g.ID)})
		ends = append(ends, g.ExpiresAt)
	}
	s.mu.Lock()
	s.alarms, s.ends = alarms, ends
	s.mu.Unlock()
	return nil
}

// Alarms lists breakglass_active for each live grant and
// breakglass_unsealed for each live row whose seal does not verify, as
// the last RunOnce found them; a grant's alarm closes at its expiry even
// before the next list.
func (s *Service) Alarms() []assembler.Alarm {
	if s == nil {
		return nil
	}
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []assembler.Alarm
	for i, a := range s.alarms {
		if now.Before(s.ends[i]) {
			out = append(out, a)
		}
	}
	return out
}
