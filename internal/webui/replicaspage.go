package webui

import (
	"net/http"

	"github.com/musterhq/muster/views"
)

// replicasPage shows the region's shard ownership as this replica last
// read it (GET /v1/replicas). Every signed-in role may read it.
func (u *UI) replicasPage(w http.ResponseWriter, r *http.Request, pg views.Page) {
	pg.Title, pg.Nav, pg.Refresh = "Replicas", "replicas", 15
	rp := views.Replicas{Page: pg, EpochsLeft: -1}
	if u.cfg.EpochsLeft != nil {
		rp.EpochsLeft = int64(u.cfg.EpochsLeft())
	}
	if u.cfg.Ownership != nil {
		reg := u.cfg.Ownership.Region()
		rp.Configured, rp.ReadAt, rp.Shards, rp.Unowned = true, reg.At, reg.Shards, reg.Unowned
		relayed := map[string]*views.RelayRow{}
		if u.cfg.Relay != nil {
			rp.Relaying = true
			for _, st := range u.cfg.Relay.Status() {
				relayed[st.Peer] = &views.RelayRow{Connected: st.Connected, Since: st.Since, LagSeconds: st.LagSeconds,
					Updates: st.Updates, LastError: st.LastError, Stale: st.Stale, HeardBy: st.HeardBy, StaleServices: st.StaleServices}
			}
		}
		for _, x := range reg.Replicas {
			rp.Replicas = append(rp.Replicas, views.ReplicaRow{ID: x.ID, Address: x.Address, StartedAt: x.StartedAt,
				LastSeen: x.LastSeen, Shards: x.Shards, Self: x.ID == reg.Self, Relay: relayed[x.ID]})
		}
		for _, t := range reg.Owned {
			rp.Owned = append(rp.Owned, views.TenureRow{Shard: t.Shard, Epoch: t.Epoch, Since: t.Since, Expires: t.Expires, Deadline: t.Deadline})
		}
	}
	u.render(w, r, http.StatusOK, views.ReplicasPage(rp))
}
