package publisher

import "github.com/musterhq/muster/internal/assembler"

// SetVersions replaces the version source Prepare made, so a test can
// start near the end of an epoch instead of publishing 2^31 versions.
func (p *Publisher) SetVersions(v *assembler.Versions) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.versions = v
}

// SetBeforeLoad makes Prepare run f before it loads the saved views; an
// error from f fails the load.
func (p *Publisher) SetBeforeLoad(f func() error) { p.beforeLoad = f }
