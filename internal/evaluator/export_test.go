package evaluator

import "context"

// SetAfterAssignmentsRead makes every refresh call f just after it read
// the prober assignments (nil: nothing).
func (e *Evaluator) SetAfterAssignmentsRead(f func(context.Context)) {
	if f == nil {
		e.afterAssignmentsRead.Store(nil)
		return
	}
	e.afterAssignmentsRead.Store(&f)
}

// ProberCovers says whether prober is assigned service, as ingest would
// find it.
func (e *Evaluator) ProberCovers(prober, service string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	a := e.probers[prober]
	return a != nil && a.services[service]
}
