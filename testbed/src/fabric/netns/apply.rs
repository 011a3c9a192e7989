//! Building a plan with iproute2, taking it down again, and cutting one
//! link of it.

use std::collections::{BTreeMap, BTreeSet};
use std::io;

use super::enter::in_namespace;
use super::host::require_root;
use super::ip::{
    Batch, addr_only, in_block, link_names, list_namespaces, network_of, root_addresses,
    root_links, run_ip, run_parallel,
};
use super::plan::{check_prefix, mgmt_block};
use super::{NetPlan, NetnsError, Veth};

/// The `ip` lines that route traffic from a veth's side-b address out of
/// side b only.
pub(super) fn source_route_lines(veth: &Veth, replace: bool) -> Vec<String> {
    let (Some(table), Some(addr)) = (veth.source_table, &veth.addr_b) else {
        return Vec::new();
    };
    let Some(net) = network_of(addr) else {
        return Vec::new();
    };
    let verb = if replace { "replace" } else { "add" };
    let src = addr_only(addr);
    let mut lines = vec![format!(
        "route {verb} {net} dev {} src {src} table {table}",
        veth.name_b
    )];
    if !replace {
        lines.push(format!("route add unreachable default table {table}"));
        lines.push(format!(
            "rule add from {src} table {table} priority {table}"
        ));
    }
    lines
}

/// Removes the plan's namespaces and root-side interfaces when dropped.
///
/// Stop every process running inside the namespaces first: a namespace's
/// interfaces live until its last process exits (its name goes at once).
#[derive(Debug)]
pub struct NetnsGuard {
    prefix: String,
    namespaces: Vec<String>,
    root_links: Vec<String>,
    group: u32,
    done: bool,
}

impl NetnsGuard {
    /// The run's prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The namespaces this guard removes.
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    /// Removes everything now and reports problems (dropping does the same
    /// but can only log them).
    pub fn teardown(mut self) -> Result<(), NetnsError> {
        self.done = true;
        remove(&self.namespaces, &self.root_links, &[self.group]).map(drop)
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        if let Err(e) = remove(&self.namespaces, &self.root_links, &[self.group]) {
            tracing::warn!(
                "removing network namespaces of {} failed: {e} \
                 (`testbed down` removes leftovers)",
                self.prefix
            );
        }
    }
}

/// Deletes those of `namespaces` and root `links` that exist; returns how many.
///
/// Root-side interfaces go first: every veth deletion waits for a kernel RCU
/// grace period, so each of `groups` whose members are all in `links` goes
/// with one `ip link del group` (one wait for all), and the rest each with
/// its own `ip` side by side (the waits overlap). Waiting for a deleted
/// namespace's cleanup to take them is slower still. Deleting the namespaces
/// then takes their veth pairs with them.
pub(super) fn remove(
    namespaces: &[String],
    links: &[String],
    groups: &[u32],
) -> Result<usize, NetnsError> {
    let existing_ns = list_namespaces()?;
    let existing_links = root_links()?;
    let mut pending: Vec<&String> = links
        .iter()
        .filter(|l| existing_links.contains(l))
        .collect();
    let count = pending.len();
    for group in groups {
        let group = group.to_string();
        let members = link_names(&run_ip(&["-o", "link", "show", "group", &group])?);
        if !members.is_empty() && members.iter().all(|m| links.contains(m)) {
            // Errors show in the check below.
            let _ = run_ip(&["link", "del", "group", &group]);
            pending.retain(|l| !members.contains(l));
        }
    }
    let link_batches: Vec<Batch> = pending
        .iter()
        .map(|link| {
            let mut batch = Batch::new(None);
            batch.push(format!("link del dev {link}"));
            batch
        })
        .collect();
    let links_result = run_parallel(&link_batches);
    let mut batch = Batch::new(None);
    for ns in namespaces.iter().filter(|n| existing_ns.contains(n)) {
        batch.push(format!("netns del {ns}"));
    }
    let count = count + batch.lines.len();
    let ns_result = batch.run(true);

    let now = list_namespaces()?;
    let ns_left: Vec<&String> = namespaces.iter().filter(|n| now.contains(n)).collect();
    let now = root_links()?;
    let links_left: Vec<&String> = links.iter().filter(|l| now.contains(l)).collect();
    if !ns_left.is_empty() {
        ns_result?;
    }
    if !links_left.is_empty() {
        links_result?;
    }
    if !ns_left.is_empty() || !links_left.is_empty() {
        return Err(NetnsError::InUse(format!(
            "still present after removal: namespaces {ns_left:?}, root interfaces {links_left:?}"
        )));
    }
    Ok(count)
}

/// Builds the plan: namespaces, bridges, veth pairs, addresses, `lo` up. On
/// any failure removes what it created and returns the error, naming the
/// failing `ip` command and its stderr.
pub fn apply(plan: &NetPlan) -> Result<NetnsGuard, NetnsError> {
    require_root()?;
    check_prefix(&plan.prefix)?;
    let root_names: Vec<String> = plan.root_links().map(str::to_owned).collect();

    // Refuse to touch anything that is already there.
    let existing_ns = list_namespaces()?;
    if let Some(ns) = plan
        .namespaces
        .iter()
        .find(|h| existing_ns.contains(&h.name))
    {
        return Err(NetnsError::InUse(format!(
            "network namespace {} already exists (left over from a crashed run? \
             `testbed down` removes it)",
            ns.name
        )));
    }
    let existing_links = root_links()?;
    if let Some(link) = root_names.iter().find(|l| existing_links.contains(l)) {
        return Err(NetnsError::InUse(format!(
            "interface {link} already exists in the root namespace (left over from a \
             crashed run? `testbed down` removes it)"
        )));
    }
    let block = mgmt_block(&plan.prefix);
    if let Some(addr) = root_addresses()?.into_iter().find(|a| in_block(*a, block)) {
        return Err(NetnsError::InUse(format!(
            "the management block {} of prefix {} is in use ({addr} is on this machine); \
             use another prefix, or `testbed down` if it is a leftover",
            plan.mgmt_subnet, plan.prefix
        )));
    }

    let guard = NetnsGuard {
        prefix: plan.prefix.clone(),
        namespaces: plan.namespaces.iter().map(|h| h.name.clone()).collect(),
        root_links: root_names,
        group: plan.mgmt_group,
        done: false,
    };

    // Root namespace: namespaces, bridges, veth pairs, root-side addresses.
    let mut root = Batch::new(None);
    for host in &plan.namespaces {
        root.push(format!("netns add {}", host.name));
    }
    for bridge in &plan.bridges {
        root.push(format!(
            "link add name {} netns {} type bridge",
            bridge.name, bridge.ns
        ));
    }
    // Root-side ends join the run's interface group (fast teardown).
    let place = |ns: &Option<String>| match ns {
        Some(ns) => format!("netns {ns}"),
        None => format!("group {}", plan.mgmt_group),
    };
    for veth in &plan.veths {
        root.push(format!(
            "link add name {} {} type veth peer name {} {}",
            veth.name_a,
            place(&veth.ns_a),
            veth.name_b,
            place(&veth.ns_b)
        ));
    }

    // Per namespace: lo, bridges, addresses, ports, links up, source routes.
    let mut batches: BTreeMap<&str, Batch> = BTreeMap::new();
    for host in &plan.namespaces {
        let mut batch = Batch::new(Some(&host.name));
        batch.push("link set dev lo up".to_owned());
        batches.insert(host.name.as_str(), batch);
    }
    for bridge in &plan.bridges {
        let batch = batches
            .entry(bridge.ns.as_str())
            .or_insert_with(|| Batch::new(Some(&bridge.ns)));
        batch.push(format!("addr add {} dev {}", bridge.addr, bridge.name));
        batch.push(format!("link set dev {} up", bridge.name));
    }
    let mut strict_arp = BTreeSet::new();
    for veth in &plan.veths {
        let ends = [
            (&veth.name_a, &veth.ns_a, &veth.addr_a, &veth.bridge_a),
            (&veth.name_b, &veth.ns_b, &veth.addr_b, &veth.bridge_b),
        ];
        for (name, ns, addr, bridge) in ends {
            let batch = match ns {
                None => &mut root,
                Some(ns) => batches
                    .entry(ns.as_str())
                    .or_insert_with(|| Batch::new(Some(ns))),
            };
            if let Some(bridge) = bridge {
                batch.push(format!("link set dev {name} master {bridge}"));
            }
            if let Some(addr) = addr {
                batch.push(format!("addr add {addr} dev {name}"));
            }
            batch.push(format!("link set dev {name} up"));
        }
        if veth.source_table.is_some()
            && let Some(ns) = &veth.ns_b
        {
            let batch = batches
                .entry(ns.as_str())
                .or_insert_with(|| Batch::new(Some(ns)));
            for line in source_route_lines(veth, false) {
                batch.push(line);
            }
            strict_arp.insert(ns.clone());
        }
    }
    let batches: Vec<Batch> = batches.into_values().collect();

    root.run(false)?;
    run_parallel(&batches)?;
    for ns in &strict_arp {
        // Answer ARP only on the interface that has the address, and use it
        // as the source, so several RNICs on one subnet stay separate wires.
        in_namespace(ns, || -> io::Result<()> {
            std::fs::write("/proc/sys/net/ipv4/conf/all/arp_ignore", "1")?;
            std::fs::write("/proc/sys/net/ipv4/conf/all/arp_announce", "2")
        })?
        .map_err(|source| NetnsError::Namespace {
            name: ns.clone(),
            source,
        })?;
    }
    Ok(guard)
}

/// Takes one topology link down or up (chaos `cut-link`): both ends, each in
/// its namespace. Bringing an RNIC back up re-installs its source route.
pub fn set_link(veth: &Veth, up: bool) -> Result<(), NetnsError> {
    let state = if up { "up" } else { "down" };
    for (name, ns) in veth.ends() {
        let mut args = Vec::new();
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        args.extend(["link", "set", "dev", name, state]);
        run_ip(&args)?;
    }
    if up && veth.source_table.is_some() {
        let mut batch = Batch::new(veth.ns_b.as_deref());
        for line in source_route_lines(veth, true) {
            batch.push(line);
        }
        batch.run(false)?;
    }
    Ok(())
}
