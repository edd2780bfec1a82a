package audit

import (
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Authentication failures: requests refused for want of a valid
// token (forged, expired, from an unknown issuer, malformed) are put on
// the record the way refused evidence is, without flooding it: one refused
// "auth.refuse" row per source address per minute at most, with the
// counts by failure code (identity.FailureCode). The token is never on
// it, nor anything it claims: an unverified token's claims are the
// sender's word.

// ActionAuthRefuse is the action of an authentication-failure summary.
const ActionAuthRefuse = "auth.refuse"

// AuthSourcePrefix starts the actor of an authentication-failure summary:
// "source:" and the address (an IPv6 address's /64).
const AuthSourcePrefix = "source:"

// NewAuthFailureSummaries returns a stopped RefusalSummaries for
// authentication failures: Record("anonymous", AuthSourcePrefix+address,
// items), one item per refused request with its failure code as Code.
// cfg.Entry and the metrics are set
// here.
func NewAuthFailureSummaries(cfg RefusalSummariesConfig) (*RefusalSummaries, error) {
	cfg.Entry = authFailureEntry
	cfg.Unaudited = prometheus.CounterOpts{Name: "muster_auth_failures_unaudited_total",
		Help: "Requests refused for want of a valid token that no audit summary will carry: more source addresses failing at once than summarised (100,000), or summaries still unwritten at shutdown."}
	cfg.Rows = prometheus.CounterOpts{Name: "muster_auth_failure_summaries_total",
		Help: "Authentication-failure summaries written to the audit log (at most one per source address per minute)."}
	return NewRefusalSummaries(cfg)
}

func authFailureEntry(p Summary) Entry {
	source := strings.TrimPrefix(p.Actor, AuthSourcePrefix)
	return Entry{
		ActorKind: p.ActorKind, Actor: p.Actor, Action: ActionAuthRefuse, TargetKind: "source", Target: source,
		Outcome: Refused,
		Reason: fmt.Sprintf("%d requests from %s refused for want of a valid token from %s to %s (%s)",
			p.Total, source, p.First.UTC().Format(time.RFC3339), p.Last.UTC().Format(time.RFC3339), counts(p.Codes)),
		After: map[string]any{
			"refused_total": p.Total, "by_reason": p.Codes,
			"from": p.First.UTC(), "to": p.Last.UTC(),
		},
	}
}
