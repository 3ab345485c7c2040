-- Argo CD health check for ai.krateo.io/v1 InferenceRun and InferenceConfig.
--
-- Install it under both keys of argocd-cm (docs/gitops-health.md,
-- "Argo CD"):
--   resource.customizations.health.ai.krateo.io_InferenceRun
--   resource.customizations.health.ai.krateo.io_InferenceConfig
-- Argo CD sets the global `obj` (the live object) and reads the returned
-- table: hs.status is Healthy, Progressing, Degraded, Suspended or Unknown,
-- hs.message a line for the UI. Plain Lua 5.1 (Argo CD runs gopher-lua).

local hs = {}

local function condition(status, type_)
  if status == nil or status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == type_ then
      return c
    end
  end
  return nil
end

-- The status' own words: message, else reason, else the fallback.
local function words(status, fallback)
  if status.message ~= nil and status.message ~= "" then
    return status.message
  end
  if status.reason ~= nil and status.reason ~= "" then
    return status.reason
  end
  return fallback
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the controller to observe the " .. tostring(obj.kind)
  return hs
end

-- A status written for an older spec says nothing about the current one.
local generation = obj.metadata ~= nil and obj.metadata.generation or nil
if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration ~= generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the controller to observe generation " .. tostring(generation)
    .. " (it has seen " .. tostring(status.observedGeneration) .. ")"
  return hs
end

if obj.kind == "InferenceConfig" then
  local ready = condition(status, "Ready")
  if ready == nil or ready.status == "Unknown" then
    hs.status = "Progressing"
    hs.message = "Waiting for the controller to validate the config"
  elseif ready.status == "True" then
    hs.status = "Healthy"
    hs.message = "The config is valid"
    local probed = condition(status, "Probed")
    if probed ~= nil and probed.status == "False" then
      -- Usable, but its last probe failed: runs will say so in a Warning.
      hs.message = "The config is valid; its last probe failed (" .. tostring(probed.reason)
        .. "): " .. tostring(probed.message)
    end
  else
    hs.status = "Degraded"
    hs.message = words(ready, "The config is not usable")
  end
  return hs
end

-- InferenceRun: the phase says it all, but for a runner on a lost node.
local phase = status.phase
local scheduled = obj.spec ~= nil and obj.spec.schedule ~= nil and obj.spec.schedule ~= ""

-- NodeLost: a runner pod stays Terminating on a node that stopped reporting,
-- and the run goes no further until someone brings the node back or taints it
-- out of service. A one-shot run says so in its reason, a scheduled one in
-- the execution under way.
local lost = nil
if (phase == "Pending" or phase == "Running") and status.reason == "NodeLost" then
  lost = status
elseif scheduled and phase == "Running" and status.recentExecutions ~= nil then
  for _, e in ipairs(status.recentExecutions) do
    if e.reason == "NodeLost" and (e.phase == "Pending" or e.phase == "Running") then
      lost = e
      break
    end
  end
end

if lost ~= nil then
  hs.status = "Degraded"
  hs.message = words(lost, "A runner pod is on a lost node")
  if lost ~= status then
    hs.message = "Execution " .. tostring(lost.name) .. ": " .. hs.message
  end
elseif phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the controller to start the run"
elseif phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = "The run succeeded"
  if status.result ~= nil and status.result.predictions ~= nil then
    hs.message = "The run succeeded: " .. tostring(status.result.predictions) .. " predictions"
  end
elseif phase == "Failed" or phase == "Error" then
  hs.status = "Degraded"
  hs.message = words(status, "The run " .. (phase == "Error" and "cannot start" or "failed"))
elseif phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = "The run is suspended"
elseif phase == "Scheduled" or (scheduled and phase == "Running") then
  -- A scheduled run is healthy once its CronJob exists; executions come and go.
  hs.status = "Healthy"
  hs.message = phase == "Running" and "An execution is running" or "Waiting for the next execution"
  local last = status.lastExecution
  if last ~= nil and last.phase == "Failed" then
    hs.message = hs.message .. "; the last one, " .. tostring(last.name) .. ", failed: "
      .. words(last, "no reason given")
  end
elseif phase == "Pending" then
  hs.status = "Progressing"
  hs.message = words(status, "The run is pending")
elseif phase == "Running" then
  hs.status = "Progressing"
  hs.message = "The run is running"
  if status.progress ~= nil and status.progress.summary ~= nil then
    hs.message = "The run is running: " .. status.progress.summary
  end
else
  hs.status = "Unknown"
  hs.message = "Unknown phase " .. tostring(phase)
end
return hs
