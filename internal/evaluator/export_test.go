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
