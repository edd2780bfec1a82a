package evaluator

import (
	"slices"
	"sync"

	"github.com/musterhq/muster/internal/eligibility"
)

// Changes is what the evaluator has changed since the next stage (the
// publisher) last took its changes: the transitions, and the services
// whose view may differ without one.
type Changes struct {
	// Transitions are eligibility changes in the order they were
	// computed, including an ended instance's last one.
	Transitions []eligibility.Transition
	// Services names, sorted, the services whose view changed without a
	// transition: the instance set or contract (an instance added, say),
	// an override, or an instance's health (known, unknown) or quarantine
	// (eligibility.Engine.Changed).
	Services []string
}

// Empty reports whether c holds nothing.
func (c Changes) Empty() bool { return len(c.Transitions) == 0 && len(c.Services) == 0 }

// changeQueue holds the changes the evaluation loop computed until the
// publisher takes them. Data flows one way: the evaluator only adds and
// signals, the publisher pulls (Evaluator.Changed, TakeChanges), so the
// evaluator knows nothing of who reads it and never waits for it.
type changeQueue struct {
	mu       sync.Mutex
	ts       []eligibility.Transition
	services map[string]struct{}
	limit    int
	ready    chan struct{} // one token: changes are waiting
}

func newChangeQueue(limit int) *changeQueue {
	return &changeQueue{services: map[string]struct{}{}, limit: limit, ready: make(chan struct{}, 1)}
}

// add queues what one evaluation changed. Beyond limit transitions (a
// reader that stopped taking), the oldest are dropped and only their
// services kept: the views still follow, at worst without the withdrawal
// lag of the dropped ones.
func (q *changeQueue) add(ts []eligibility.Transition, services []string) {
	if len(ts) == 0 && len(services) == 0 {
		return
	}
	q.mu.Lock()
	for _, s := range services {
		q.services[s] = struct{}{}
	}
	q.ts = append(q.ts, ts...)
	if over := len(q.ts) - q.limit; over > 0 {
		for _, t := range q.ts[:over] {
			q.services[t.Service] = struct{}{}
		}
		q.ts = slices.Delete(q.ts, 0, over)
	}
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// take returns and forgets what is queued.
func (q *changeQueue) take() Changes {
	q.mu.Lock()
	defer q.mu.Unlock()
	c := Changes{Transitions: q.ts}
	if len(q.services) > 0 {
		c.Services = make([]string, 0, len(q.services))
		for s := range q.services {
			c.Services = append(c.Services, s)
		}
		slices.Sort(c.Services)
		clear(q.services)
	}
	q.ts = nil
	return c
}

// Changed returns a channel that receives a value when changes are
// waiting to be taken (TakeChanges); one value may stand for many
// evaluations.
func (e *Evaluator) Changed() <-chan struct{} { return e.changes.ready }

// TakeChanges returns what changed since the last call and forgets it.
// Every transition an evaluation computed is in it once that evaluation
// has returned (EvaluateNow included). The publisher is its reader.
func (e *Evaluator) TakeChanges() Changes { return e.changes.take() }
