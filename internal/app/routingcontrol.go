package app

import (
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/routingcontrol"
)

// WorkerRoutingControl reads the out-of-band region routing controls
// (internal/routingcontrol; ADR-14, issue 29).
const WorkerRoutingControl = "routing-control"

// buildRoutingControl builds the routing controls' reader from
// Config.RoutingControl: its Audit, Logger, Registerer and Replica are
// the app's, its clock the app's unless set, and this muster's region
// and its configured ones count as known regions.
func (a *App) buildRoutingControl(cfg Config, auditLog *audit.Log) error {
	if cfg.RoutingControl == nil {
		return nil
	}
	rc := *cfg.RoutingControl
	rc.Audit, rc.Logger, rc.Registerer, rc.Replica = auditLog, a.log, a.Metrics, cfg.Replica
	rc.Now = orNow(rc.Now, cfg.Now)
	if cfg.Region != "" && routingcontrol.ValidRegion(cfg.Region) {
		rc.Regions = append(rc.Regions[:len(rc.Regions):len(rc.Regions)], cfg.Region)
	}
	var err error
	a.RoutingControls, err = routingcontrol.New(rc)
	return err
}
