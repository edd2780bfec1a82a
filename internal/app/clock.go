package app

import (
	"fmt"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/assembler"
)

// AlarmClockSkew is raised while this replica's clock is further from
// PostgreSQL's than the threshold (Config.ClockSkewAlarm). Nothing muster
// decides depends on it: lease times are the database's, and forwarded
// evidence is moved onto the receiver's clock by the request's signing
// time. But the figures a replica shows (ages, the relay's lag, audit
// times) are on its own clock, and a clock that wanders this far is
// worth fixing before it passes the replicas' signature window (2 min),
// beyond which they stop talking to each other.
const AlarmClockSkew = "clock_skew"

// clockSkewAlarm is AlarmClockSkew from the monitor's last measurement.
func clockSkewAlarm(s db.ClockSkew) (assembler.Alarm, bool) {
	if !s.Over {
		return assembler.Alarm{}, false
	}
	way := "ahead of"
	if s.Skew < 0 {
		way = "behind"
	}
	return assembler.Alarm{Kind: AlarmClockSkew, Since: s.Since, Detail: fmt.Sprintf(
		"this replica's clock is %.1f s %s PostgreSQL's (within ±%s, half the ping's round trip; threshold %s): leases and forwarded evidence do not depend on it, but its own ages and audit times are off by as much; replicas stop accepting each other's requests beyond a skew of 2 min",
		abs(s.Skew).Seconds(), way, (s.RoundTrip / 2).Round(time.Microsecond), s.Threshold)}, true
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// replicaAlarms are the alarms of this replica's clock and of its
// exchanges with its peers: clock_skew, evidence_refused and
// peer_trust_upgrade.
func (a *App) replicaAlarms() []assembler.Alarm {
	var out []assembler.Alarm
	if al, ok := clockSkewAlarm(a.Monitor.ClockSkew()); ok {
		out = append(out, al)
	}
	if a.Forwarder != nil {
		out = append(out, a.Forwarder.Alarms()...)
	}
	return append(out, a.peerTrustAlarms()...)
}
