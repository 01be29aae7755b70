-- Argo CD health of Plinth's policy objects from their kstatus conditions (docs/design.md,
-- "Names": every Plinth kind carries status.conditions Ready, Reconciling, Stalled and
-- status.observedGeneration). The same script serves every policy kind: argocd-cm.yaml embeds it.
local hs = {}
if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for Plinth to report status"
  return hs
end
if obj.metadata.generation ~= nil and (obj.status.observedGeneration == nil or obj.status.observedGeneration < obj.metadata.generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for Plinth to observe generation " .. tostring(obj.metadata.generation)
  return hs
end
local ready = nil
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Stalled" and c.status == "True" then
    hs.status = "Degraded"
    hs.message = c.message or c.reason or "Stalled"
    return hs
  end
  if c.type == "Ready" then
    ready = c
  end
end
if ready == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the Ready condition"
  return hs
end
if ready.status == "True" then
  hs.status = "Healthy"
else
  hs.status = "Progressing"
end
hs.message = ready.message or ready.reason or ""
return hs
