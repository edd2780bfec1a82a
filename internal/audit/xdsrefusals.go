package audit

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// xDS refusals: streams and requests refused for a limit per principal
// (too many names on a stream, too many streams, too many names' bytes)
// are put on the record the way refused evidence is, without flooding
// it: one refused "xds.refuse" row per principal per minute at most,
// with the counts by limit and the first few refusals' texts.

// ActionXDSRefuse is the action of an xDS refusal summary.
const ActionXDSRefuse = "xds.refuse"

// NewXDSRefusalSummaries returns a stopped RefusalSummaries for xDS
// refusals: Record(kind, principal, items), one item per refusal with
// the limit's reason as Code and the refusal's text as Reason. cfg.Entry
// and the metrics are set here.
func NewXDSRefusalSummaries(cfg RefusalSummariesConfig) (*RefusalSummaries, error) {
	cfg.Entry = xdsRefusalEntry
	cfg.Unaudited = prometheus.CounterOpts{Name: "muster_xds_refusals_unaudited_total",
		Help: "xDS streams and requests refused for a limit per principal that no audit summary will carry: more principals refused at once than summarised (100,000), or summaries still unwritten at shutdown."}
	cfg.Rows = prometheus.CounterOpts{Name: "muster_xds_refusal_summaries_total",
		Help: "xDS refusal summaries written to the audit log (at most one per principal per minute)."}
	return NewRefusalSummaries(cfg)
}

func xdsRefusalEntry(p Summary) Entry {
	details := make([]string, len(p.Items))
	for i, it := range p.Items {
		details[i] = Clip(it.Reason, 300)
	}
	return Entry{
		ActorKind: p.ActorKind, Actor: p.Actor, Action: ActionXDSRefuse, TargetKind: "principal", Target: p.Actor,
		Outcome: Refused,
		Reason: fmt.Sprintf("%d xDS streams or requests of %s refused for a limit from %s to %s (%s)",
			p.Total, p.Actor, p.First.UTC().Format(time.RFC3339), p.Last.UTC().Format(time.RFC3339), counts(p.Codes)),
		After: map[string]any{
			"refused_total": p.Total, "by_reason": p.Codes, "first_refused": details,
			"from": p.First.UTC(), "to": p.Last.UTC(),
		},
	}
}
